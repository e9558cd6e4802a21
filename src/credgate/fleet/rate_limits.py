"""Rate limits: per process (a token bucket in memory), or counted once for every worker and instance that
share a Redis (GCRA in one script; at most one round trip a request, fewer under load).

GCRA (the generic cell rate algorithm) keeps one number per project, the theoretical arrival time, and admits
exactly what the per-process token bucket (`RateLimiter`) admits: `rate` requests a minute,
refilled continuously, bursting up to the full minute. Time is Redis's own clock, so instances whose clocks
differ still agree. When Redis does not answer, the request is counted in this process instead (logged once),
and Redis is tried again a second later.
"""

import logging
import math
import time
from dataclasses import dataclass
from typing import Protocol

from credgate.fleet.fleet import RETRY_SECONDS, Fleet, ScriptKeys
from credgate.fleet.turns import TurnBatch
from credgate.outages import Outage

logger = logging.getLogger(__name__)

# One call counts a batch: KEYS are the projects' theoretical arrival times (µs, Redis's clock), each once; ARGV[1]
# the checks, in order, each a key's index in KEYS and its limit in requests a minute ("1 600 2 60 1 600"): packed
# so, a turn of 20 checks sends 2 arguments instead of 40 (redis-py writes each in Python). The burst is a minute's
# worth. Returns, for each check, 0 when admitted, else the µs to wait. A project twice in one batch is counted
# twice, in order.
_GCRA = """
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local waits = {}
for index, rate in string.gmatch(ARGV[1], '(%d+) (%d+)') do
  local key = KEYS[tonumber(index)]
  local tat = tonumber(redis.call('GET', key)) or now_us
  if tat < now_us then tat = now_us end
  local next_tat = tat + 60000000 / tonumber(rate)
  local wait = next_tat - now_us - 60000000
  if wait > 0 then
    waits[#waits + 1] = math.ceil(wait)
  else
    redis.call('SET', key, next_tat, 'PX', math.ceil((next_tat - now_us) / 1000) + 1)
    waits[#waits + 1] = 0
  end
end
return waits
"""


class RateLimits(Protocol):
    async def check(self, project_id: str, rate_per_minute: int) -> float:
        """0 when the request may go now, else the seconds to wait before one may."""
        ...


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float
    rate_per_minute: int


class RateLimiter:
    """Allows `rate_per_minute` requests per project, refilled continuously, bursting up to the full minute."""

    def __init__(self, *, max_projects: int = 100_000) -> None:
        self._buckets: dict[str, _Bucket] = {}
        self._max_projects = max_projects

    def acquire(self, project_id: str, rate_per_minute: int, *, now: float | None = None) -> float:
        """0 when the request may go now, else the seconds to wait before one may."""
        now = time.monotonic() if now is None else now
        bucket = self._buckets.get(project_id)
        if bucket is None or bucket.rate_per_minute != rate_per_minute:
            if len(self._buckets) >= self._max_projects:
                self._buckets.clear()
            bucket = self._buckets[project_id] = _Bucket(float(rate_per_minute), now, rate_per_minute)
        per_second = rate_per_minute / 60
        bucket.tokens = min(float(rate_per_minute), bucket.tokens + (now - bucket.updated) * per_second)
        bucket.updated = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / per_second

    async def check(self, project_id: str, rate_per_minute: int) -> float:
        return self.acquire(project_id, rate_per_minute)


class SharedRateLimiter:
    """The RateLimits of a fleet: counted in Redis (the checks of a turn in one call), in `local` while Redis
    does not answer."""

    def __init__(self, fleet: Fleet, local: RateLimiter) -> None:
        self._fleet = fleet
        self._script = fleet.redis.register_script(_GCRA)
        self._local = local
        outage = Outage(
            logger,
            down="Redis does not answer (%s): rate limits are counted per process until it does",
            back="Redis answers again: rate limits are shared again",
            retry_seconds=RETRY_SECONDS,
        )
        self._checks: TurnBatch[tuple[str, int], float] = TurnBatch(self._call, outage)

    async def check(self, project_id: str, rate_per_minute: int) -> float:
        """0 when the request may go now, else the seconds to wait before one may."""
        wait = await self._checks.ask((self._fleet.key("rate", project_id), rate_per_minute))
        return self._local.acquire(project_id, rate_per_minute) if wait is None else wait

    async def _call(self, checks: list[tuple[str, int]]) -> list[float]:
        keys = ScriptKeys()
        packed = " ".join(f"{keys.of(key)} {rate}" for key, rate in checks)
        answered = await self._script(keys=list(keys), args=[packed])
        return [int(wait_us) / 1_000_000 for wait_us in answered]

    async def aclose(self) -> None:
        """Let the calls under way end (shutting down)."""
        await self._checks.aclose()


def retry_after_header(wait_seconds: float) -> str:
    """The Retry-After value for a wait: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_seconds)))
