"""Key pools as the proxy uses them: which keys a request tries, in which order, and what a provider's answer
does to a key. Failover happens only before any byte reached the client (the relay's part).

- A key the provider refuses (401, 403) is taken out of service: at once in this process, and in the database
  (audited), so that every worker and instance stops using it once the change reaches it, until an admin acts.
- A key the provider has wait (429, 402) cools down for its `Retry-After` (or 30 s): in this process at once, and
  in every other that shares the fleet's Redis once the notice reaches it.
- A connection failure is not a key's fault: it is the upstream's, and answered as such (502, 504).
"""

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from email.utils import parsedate_to_datetime

from credgate import metrics
from credgate.proxy.http_client import UpstreamResponse
from credgate.resolved import PoolKey, ResolvedIntegration

logger = logging.getLogger(__name__)
FAILOVER_MAX_BODY_BYTES = 4 * 1024 * 1024  # a request body kept to be sent again to the next key
DEFAULT_COOL_SECONDS = 30.0
MAX_COOL_SECONDS = 3600.0
_MAX_REMEMBERED = 10_000

TakeOut = Callable[[str, str, str, str], Awaitable[None]]
"""(project id, provider, key id, failure): record that the provider refused the key."""
Announce = Callable[[str, float], Awaitable[None]]
"""(key id, until as a Unix time): tell the other processes that the key rests."""


class KeyPools:
    """This process's view of the pools: whose turn it is (spread), and which keys rest."""

    def __init__(
        self, take_out: TakeOut, *, announce: Announce | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._take_out = take_out
        self.announce = announce
        self._clock = clock
        self._turns: dict[tuple[str, str], int] = {}
        self._resting: dict[str, float] = {}  # key id → when it may be tried again (429, 402)
        # key id → the integration, as cached, whose key it was when refused: skipped until the cache holds a
        # newer one (the change that takes the key out, or an admin's that puts it back).
        self._refused: dict[str, ResolvedIntegration] = {}
        self._background: set[asyncio.Task[None]] = set()

    def attempts(self, project_id: str, integration: ResolvedIntegration) -> list[PoolKey]:
        """The keys a request tries, in order: those not resting; with "spread", starting at the next turn."""
        now = self._clock()
        keys = [
            key for key in integration.keys if self._resting.get(key.id, 0.0) <= now and self._usable(key, integration)
        ]
        if integration.key_strategy == "spread" and len(keys) > 1:
            pool = (project_id, integration.provider)
            if len(self._turns) >= _MAX_REMEMBERED:
                self._turns.clear()  # bounded; a turn forgotten only moves a start
            turn = self._turns.get(pool, 0)
            self._turns[pool] = turn + 1
            start = turn % len(keys)
            keys = keys[start:] + keys[:start]
        return keys

    def _usable(self, key: PoolKey, integration: ResolvedIntegration) -> bool:
        refused_in = self._refused.get(key.id)
        if refused_in is None:
            return True
        if refused_in is integration:
            return False
        del self._refused[key.id]  # the cache has been renewed since: what it says of the key holds
        return True

    def passes_over(
        self,
        project_id: str,
        integration: ResolvedIntegration,
        key: PoolKey,
        response: UpstreamResponse,
        *,
        last: bool,
    ) -> bool:
        """Whether a request would go on to the next key after `key` got `response`: the key then rests, or
        (refused) is taken out of service, unless it is the `last` of this request's keys, whose answer goes to
        the client as it is and which is never taken out (a pool always keeps a key in service)."""
        status = response.status
        if status in (401, 403):
            if last:
                return True
            if len(self._refused) >= _MAX_REMEMBERED:
                self._refused.clear()
            self._refused[key.id] = integration
            metrics.key_failovers.labels(integration.provider, "refused").inc()
            failure = f"refused by the provider ({status})"
            self._in_background(self._record(project_id, integration.provider, key.id, failure))
            return True
        if status in (402, 429):
            seconds = cool_seconds(response.header("Retry-After"))
            self._rest(key.id, self._clock() + seconds)
            metrics.key_failovers.labels(integration.provider, "cooling").inc()
            if self.announce is not None:
                self._in_background(self.announce(key.id, time.time() + seconds))
            return True
        return False

    def rested_elsewhere(self, key_id: str, until: float) -> None:
        """Another process was told that the key rests until `until` (a Unix time): it rests here too."""
        seconds = min(until - time.time(), MAX_COOL_SECONDS)
        if seconds > 0:
            self._rest(key_id, max(self._resting.get(key_id, 0.0), self._clock() + seconds))

    async def aclose(self) -> None:
        """Finish the recordings and announcements under way (shutting down): a key the provider refused just
        before a stop stays out of service after it."""
        await asyncio.gather(*self._background, return_exceptions=True)

    def _in_background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _rest(self, key_id: str, until: float) -> None:
        if len(self._resting) >= _MAX_REMEMBERED:
            now = self._clock()
            self._resting = {key: when for key, when in self._resting.items() if when > now}
            if len(self._resting) >= _MAX_REMEMBERED:
                self._resting.clear()  # bounded: a key forgotten is only tried once more
        self._resting[key_id] = until

    async def _record(self, project_id: str, provider: str, key_id: str, failure: str) -> None:
        try:
            await self._take_out(project_id, provider, key_id, failure)
        except Exception:  # this process keeps it out; the others find out when the provider refuses them too
            logger.exception("could not record that %s refused key %s", provider, key_id)


def cool_seconds(retry_after: str | None) -> float:
    """How long a key rests after a 429 or 402: the provider's Retry-After (seconds or a date), within bounds."""
    if retry_after:
        try:
            seconds = float(retry_after)
        except ValueError:
            try:
                seconds = parsedate_to_datetime(retry_after).timestamp() - time.time()
            except (TypeError, ValueError):
                seconds = DEFAULT_COOL_SECONDS
        if math.isfinite(seconds):
            return min(max(seconds, 1.0), MAX_COOL_SECONDS)
    return DEFAULT_COOL_SECONDS
