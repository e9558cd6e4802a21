"""Budget counters: what each budget has spent in its current period, per process or once for a whole fleet.

A request is admitted when every budget that applies to it has room (`admit`: a requests budget is counted then,
atomically, so N concurrent requests against a budget of M admit at most M); tokens and cost are added once the
response's usage is known (`settle`). A counter that does not exist yet (a new period, a restarted process, an
emptied Redis) starts from what the request log says was spent (`seed`), so a restart never resets a budget.
With Redis, the check and the count are one script for every worker and instance; when Redis does not answer,
this process counts alone (logged once), and Redis is tried again a second later.
"""

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TypeVar

from credgate.fleet.fleet import ANSWER_TIMEOUT_SECONDS, RETRY_SECONDS, Fleet
from credgate.outages import Outage
from credgate.spending import BudgetRule, Charge

logger = logging.getLogger(__name__)
T = TypeVar("T")

Seed = Callable[[str, BudgetRule, datetime], Awaitable[int]]
"""What a project's budget had spent in the period that starts at the given time, from the request log."""

# KEYS[i] a budget's counter for the period; ARGV a limit and an amount per key, then the counters' lifetime (ms).
# A key that does not exist yet answers -i (to be seeded, then asked again); a budget without room, i; else every
# amount is added and the answer is 0. A budget has room while adding its amount (at least 1) stays within it.
_ADMIT = """
for i, key in ipairs(KEYS) do
  local used = redis.call('GET', key)
  if not used then return -i end
  if tonumber(used) + math.max(tonumber(ARGV[2 * i]), 1) > tonumber(ARGV[2 * i - 1]) then return i end
end
for i, key in ipairs(KEYS) do
  local amount = tonumber(ARGV[2 * i])
  if amount > 0 then redis.call('INCRBY', key, amount) end
end
return 0
"""
# KEYS[i] a counter, ARGV[i] what to add to it: only to a counter that exists (one that does not will be seeded
# from the request log, which holds this response).
_SETTLE = """
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then redis.call('INCRBY', key, ARGV[i]) end
end
return 0
"""
_MAX_LOCAL_COUNTERS = 100_000
_LIFETIME_MS = 40 * 24 * 3600 * 1000  # past the longest period: a counter of an ended period is dropped


class LocalBudgets:
    """This process's counters."""

    def __init__(self, seed: Seed) -> None:
        self._seed = seed
        self._used: dict[str, int] = {}
        self._seeding: dict[str, asyncio.Future[int]] = {}

    async def admit(self, project_id: str, rules: Sequence[BudgetRule], at: datetime) -> BudgetRule | None:
        """None when every budget in `rules` has room (requests are then counted), else the first that has not."""
        names = [rule.counter(at) for rule in rules]
        for rule, name in zip(rules, names, strict=True):
            if name not in self._used:
                await self._seeded(project_id, rule, at, name)
        for rule, name in zip(rules, names, strict=True):
            if self._used.get(name, 0) + max(_admitted(rule), 1) > rule.amount:
                return rule
        for rule, name in zip(rules, names, strict=True):
            self._used[name] = self._used.get(name, 0) + _admitted(rule)
        return None

    def forget(self) -> None:
        """Drop every counter: each is seeded again from the request log when next used."""
        self._used.clear()

    def settle(self, charges: Sequence[Charge]) -> None:
        for rule, at, amount in charges:
            name = rule.counter(at)
            if name in self._used:
                self._used[name] += amount

    async def _seeded(self, project_id: str, rule: BudgetRule, at: datetime, name: str) -> None:
        spent = await _once(self._seeding, name, lambda: self._seed(project_id, rule, rule.window(at)[0]))
        if name not in self._used:
            if len(self._used) >= _MAX_LOCAL_COUNTERS:
                self._used.clear()  # they are seeded again from the request log
            self._used[name] = spent


async def _once(loading: dict[str, asyncio.Future[T]], name: str, make: Callable[[], Awaitable[T]]) -> T:
    """`make()`'s result, made once for every caller that asks for `name` while it is being made."""
    future = loading.get(name)
    if future is None:
        future = loading[name] = asyncio.ensure_future(make())
        future.add_done_callback(lambda _: loading.pop(name, None))
    return await asyncio.shield(future)


def _admitted(rule: BudgetRule) -> int:
    """What admitting a request adds at once: one request; tokens and cost come with the response."""
    return 1 if rule.metric == "requests" else 0


class SharedBudgets:
    """The counters of a fleet, in Redis; this process's `local` ones while Redis does not answer."""

    def __init__(self, fleet: Fleet, local: LocalBudgets, seed: Seed) -> None:
        self._fleet = fleet
        self._local = local
        self._seed = seed
        self._admit = fleet.redis.register_script(_ADMIT)
        self._settle = fleet.redis.register_script(_SETTLE)
        self._outage = Outage(
            logger,
            down="Redis does not answer (%s): budgets are counted per process until it does",
            back="Redis answers again: budgets are shared again",
            retry_seconds=RETRY_SECONDS,
        )
        self._settling: set[asyncio.Task[None]] = set()
        self._seeding: dict[str, asyncio.Future[None]] = {}

    async def admit(self, project_id: str, rules: Sequence[BudgetRule], at: datetime) -> BudgetRule | None:
        if self._outage.may_try():
            try:
                async with asyncio.timeout(ANSWER_TIMEOUT_SECONDS * 3):  # up to two seeds and a retry
                    answer = await self._admit_shared(project_id, rules, at)
            except Exception as error:  # whatever the client raises: no request may fail for it
                self._failed(error)
            else:
                self._outage.answered()
                return answer
        return await self._local.admit(project_id, rules, at)

    async def _admit_shared(self, project_id: str, rules: Sequence[BudgetRule], at: datetime) -> BudgetRule | None:
        keys = [self._fleet.key("budget", rule.counter(at)) for rule in rules]
        args = [number for rule in rules for number in (rule.amount, _admitted(rule))]
        for _ in range(len(rules) + 1):
            answer = int(await self._admit(keys=keys, args=args))
            if answer == 0:
                return None
            if answer > 0:
                return rules[answer - 1]
            rule, key = rules[-answer - 1], keys[-answer - 1]
            await _once(self._seeding, key, functools.partial(self._seed_shared, project_id, rule, at, key))
        raise RuntimeError("budget counters kept disappearing")

    async def _seed_shared(self, project_id: str, rule: BudgetRule, at: datetime, key: str) -> None:
        spent = await self._seed(project_id, rule, rule.window(at)[0])
        await self._fleet.redis.set(key, spent, nx=True, px=_LIFETIME_MS)  # another process may have been first

    def settle(self, charges: Sequence[Charge]) -> None:
        """Add what responses spent, in one call; never waits, never raises."""
        if self._outage.failing:
            self._local.settle(charges)
            return
        if not charges:
            return
        task = asyncio.ensure_future(self._settle_shared(charges))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle_shared(self, charges: Sequence[Charge]) -> None:
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_SECONDS):
                await self._settle(
                    keys=[self._fleet.key("budget", rule.counter(at)) for rule, at, _ in charges],
                    args=[amount for _, _, amount in charges],
                )
        except Exception as error:
            self._failed(error)

    def _failed(self, error: BaseException) -> None:
        if not self._outage.failing:
            self._local.forget()  # what it counted before is stale: it starts again from the request log
        self._outage.failed(error)

    async def aclose(self) -> None:
        """Finish the settlements under way (shutting down)."""
        await asyncio.gather(*self._settling, return_exceptions=True)


Budgets = LocalBudgets | SharedBudgets
