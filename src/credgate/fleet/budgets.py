"""Budget counters: what each budget has spent in its current period, per process or once for a whole fleet.

A request is admitted when every budget that applies to it has room (`admit`: a requests budget is counted then,
atomically, so N concurrent requests against a budget of M admit at most M); tokens and cost are added once the
response's usage is known (`settle`). A counter that does not exist yet (a new period, a restarted process, an
emptied Redis) starts from what the request log says was spent (`seed`), so a restart never resets a budget.
With Redis, the check and the count are one script for every worker and instance (one call for the admissions of
an event-loop turn); when Redis does not answer, this process counts alone (logged once), and Redis is tried again
a second later.
"""

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TypeVar

from credgate.fleet.fleet import ANSWER_TIMEOUT_SECONDS, RETRY_SECONDS, Fleet, ScriptKeys
from credgate.fleet.turns import TurnBatch
from credgate.outages import Outage
from credgate.spending import BudgetRule, Charge

logger = logging.getLogger(__name__)
T = TypeVar("T")

Seed = Callable[[str, BudgetRule, datetime], Awaitable[int]]
"""What a project's budget had spent in the period that starts at the given time, from the request log."""

# The admissions of one event-loop turn, in one call. KEYS are the budgets' counters for the period, each once
# however many admissions name it; ARGV[r] is the r-th admission: for each of its budgets, the counter's index in
# KEYS, the limit and the amount ("1 500 1 2 9000 100"). Packed so, a turn of 20 requests against three budgets
# sends 4 arguments instead of 200 (redis-py writes each in Python). Each answer is 0 (admitted: every amount
# added), i (its i-th budget has no room; nothing added), or -i (its i-th counter does not exist yet: to be seeded
# from the request log, then asked again). A budget has room while adding its amount (at least 1) stays within its
# limit. Admissions are judged in order, each seeing the last.
_ADMIT = """
local answers = {}
for r = 1, #ARGV do
  local budgets = {}
  for key, limit, amount in string.gmatch(ARGV[r], '(%d+) (-?%d+) (-?%d+)') do
    budgets[#budgets + 1] = {KEYS[tonumber(key)], tonumber(limit), tonumber(amount)}
  end
  local answer = 0
  for i, budget in ipairs(budgets) do
    local used = redis.call('GET', budget[1])
    if not used then
      answer = -i
      break
    end
    if tonumber(used) + math.max(budget[3], 1) > budget[2] then
      answer = i
      break
    end
  end
  if answer == 0 then
    for _, budget in ipairs(budgets) do
      if budget[3] > 0 then redis.call('INCRBY', budget[1], budget[3]) end
    end
  end
  answers[r] = answer
end
return answers
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
        self._started: dict[str, int] = {}  # what each counter started from (the request log's sum)
        self._seeding: dict[str, asyncio.Future[int]] = {}

    async def admit(self, project_id: str, rules: Sequence[BudgetRule], at: datetime) -> BudgetRule | None:
        """None when every budget in `rules` has room (requests are then counted), else the first that has not."""
        names = [rule.counter(at) for rule in rules]
        for rule, name in zip(rules, names, strict=True):
            if name not in self._used:
                await self._seeded(project_id, rule, at, name)
        for rule, name in zip(rules, names, strict=True):
            if self._used.get(name, 0) + max(rule.admission, 1) > rule.amount:
                return rule
        for rule, name in zip(rules, names, strict=True):
            self._used[name] = self._used.get(name, 0) + rule.admission
        return None

    def counted(self) -> dict[str, int]:
        """What each counter counted in this process since it started from the request log."""
        return {name: used - self._started.get(name, used) for name, used in self._used.items()}

    def forget(self) -> None:
        """Drop every counter: each starts again from the request log when next used."""
        self._used.clear()
        self._started.clear()

    def settle(self, charges: Sequence[Charge]) -> None:
        for rule, at, amount in charges:
            name = rule.counter(at)
            if name in self._used:
                self._used[name] += amount

    async def _seeded(self, project_id: str, rule: BudgetRule, at: datetime, name: str) -> None:
        spent = await _once(self._seeding, name, lambda: self._seed(project_id, rule, rule.window(at)[0]))
        if name not in self._used:
            if len(self._used) >= _MAX_LOCAL_COUNTERS:
                self.forget()  # they start again from the request log
            self._used[name] = self._started[name] = spent


async def _once(loading: dict[str, asyncio.Future[T]], name: str, make: Callable[[], Awaitable[T]]) -> T:
    """`make()`'s result, made once for every caller that asks for `name` while it is being made."""
    future = loading.get(name)
    if future is None:
        future = loading[name] = asyncio.ensure_future(make())
        future.add_done_callback(lambda _: loading.pop(name, None))
    return await asyncio.shield(future)


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
        # Each admission: its budgets' counters, limits and amounts.
        self._admissions: TurnBatch[list[tuple[str, int, int]], int] = TurnBatch(
            self._call, self._outage, failed=self._failed
        )

    async def admit(self, project_id: str, rules: Sequence[BudgetRule], at: datetime) -> BudgetRule | None:
        """None when every budget in `rules` has room (requests are then counted), else the first that has not.
        The admissions of one event-loop turn share one call to Redis."""
        budgets = [(self._fleet.key("budget", rule.counter(at)), rule.amount, rule.admission) for rule in rules]
        for _ in range(len(rules) + 1):
            answer = await self._admissions.ask(budgets)
            if answer is None:  # Redis does not answer: this process counts alone
                return await self._local.admit(project_id, rules, at)
            if answer == 0:
                return None
            if answer > 0:
                return rules[answer - 1]
            rule, key = rules[-answer - 1], budgets[-answer - 1][0]
            await _once(self._seeding, key, functools.partial(self._seed_shared, project_id, rule, at, key))
        return await self._local.admit(project_id, rules, at)  # counters that kept going away: counted here

    async def _call(self, admissions: list[list[tuple[str, int, int]]]) -> list[int]:
        """The answers of a turn's admissions, in one call (first adding what this process counted alone, when
        Redis answers again)."""
        if self._outage.failing:
            await self._reconcile()
        counters = ScriptKeys()
        packed = [
            " ".join(f"{counters.of(key)} {limit} {amount}" for key, limit, amount in budgets) for budgets in admissions
        ]
        answered = await self._admit(keys=list(counters), args=packed)
        return [int(answer) for answer in answered]

    async def _seed_shared(self, project_id: str, rule: BudgetRule, at: datetime, key: str) -> None:
        spent = await self._seed(project_id, rule, rule.window(at)[0])  # the database's failure is the request's
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_SECONDS):
                await self._fleet.redis.set(key, spent, nx=True, px=_LIFETIME_MS)  # another process may be first
        except Exception as error:  # Redis's is not: the admission is then counted here
            self._failed(error)

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
        # Each counter once, with what the batch adds to it: two arguments for a batch of 512 responses against a
        # tokens and a cost budget, not 2,048 (redis-py writes each in Python).
        totals: dict[str, int] = {}
        for rule, at, amount in charges:
            key = self._fleet.key("budget", rule.counter(at))
            totals[key] = totals.get(key, 0) + amount
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_SECONDS):
                await self._settle(keys=list(totals), args=list(totals.values()))
        except Exception as error:
            self._failed(error)

    async def _reconcile(self) -> None:
        """Redis answers again: what this process counted alone meanwhile is added to the shared counters (those
        that exist; one that does not starts from the request log, which holds it). Raises when Redis fails."""
        counted = {name: amount for name, amount in self._local.counted().items() if amount > 0}
        if counted:
            async with asyncio.timeout(ANSWER_TIMEOUT_SECONDS):
                await self._settle(
                    keys=[self._fleet.key("budget", name) for name in counted], args=list(counted.values())
                )
        self._local.forget()  # only once added: a failure leaves them to be added at the next return

    def _failed(self, error: BaseException) -> None:
        if not self._outage.failing:
            self._local.forget()  # what it counted before is stale: it starts again from the request log
        self._outage.failed(error)

    async def aclose(self) -> None:
        """Let the admissions and settlements under way end (shutting down)."""
        await self._admissions.aclose()
        await asyncio.gather(*self._settling, return_exceptions=True)


Budgets = LocalBudgets | SharedBudgets
