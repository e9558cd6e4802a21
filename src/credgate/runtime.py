"""The runtime: what one gateway process serves with once started, and the one object the planes reach it by.

create_app builds the proxy router, the admin API and the panel over a Runtime; the lifespan opens it (`running`)
and closes it. Until then, and after, the context is unavailable (503) and there is no proxy.
"""

import asyncio
import contextlib
import functools
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

from credgate.config import Settings
from credgate.errors import Unavailable
from credgate.fleet import RateLimiter, SharedRateLimiter
from credgate.fleet.budgets import LocalBudgets, SharedBudgets
from credgate.fleet.concurrency import LocalPlaces, SharedPlaces
from credgate.proxy import ProxyApp
from credgate.resolved import ResolvedIntegration
from credgate.services.access import follow_notices, watch_database
from credgate.services.budgets import spent_since
from credgate.services.context import Context
from credgate.services.events import EventDispatcher
from credgate.services.usage import UsageRecorder
from credgate.services.verification import Verification
from credgate.specs import Endpoint
from credgate.tracing import open_tracing

_YOUNG_COLLECTION_ALLOCATIONS = 10_000  # the collector's first threshold once start-up is frozen

ContextOpener = Callable[[Settings], Awaitable[Context]]
"""Opens the services' context at start: `bootstrap.open_context` (migrates, first-run setup) for one process,
`bootstrap.attach_context` for a worker of several."""


class Runtime:
    """One process's running gateway: its services' context and its proxy (with the proxy's key verifier)."""

    def __init__(
        self,
        settings: Settings,
        open_context: ContextOpener,
        *,
        context: Context | None = None,
        upstream_connections: int = 1000,
    ) -> None:
        """Given `context`, it is used as it is and left open (tests); otherwise it is opened at start and closed
        at shutdown. `upstream_connections`: the proxy's connections open at once, in each of its pools."""
        self.settings = settings
        self._open_context = open_context
        self._given_context = context
        self._upstream_connections = upstream_connections
        self._context = context
        self.proxy: ProxyApp | None = None

    @property
    def context(self) -> Context:
        if self._context is None:
            raise Unavailable("the gateway is not running")
        return self._context

    async def verify_key(self, *, project_id: str, integration: ResolvedIntegration, call: Endpoint) -> Verification:
        """The proxy's key verification (a KeyVerifier): made like any proxied request."""
        if self.proxy is None:
            raise Unavailable("key verification needs the running gateway")
        return await self.proxy.verify_key(project_id=project_id, integration=integration, call=call)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Open the context and the proxy, with the tasks that keep them current, for the block; then close."""
        settings = self.settings
        tracing = open_tracing()  # each worker exports its own spans
        ctx = self._given_context or await self._open_context(settings)
        shared = None if ctx.fleet is None else SharedRateLimiter(ctx.fleet, RateLimiter())
        rate_limits = shared or RateLimiter()
        subject_shared = None if ctx.fleet is None else SharedRateLimiter(ctx.fleet, RateLimiter())
        subject_limits = subject_shared or RateLimiter()
        seed = functools.partial(spent_since, ctx)
        budgets = LocalBudgets(seed) if ctx.fleet is None else SharedBudgets(ctx.fleet, LocalBudgets(seed), seed)
        places = LocalPlaces() if ctx.fleet is None else SharedPlaces(ctx.fleet, LocalPlaces())
        recorder = UsageRecorder(ctx, retention=timedelta(days=settings.request_log_days))
        proxy = ProxyApp(
            ctx,
            settings,
            recorder,
            rate_limits=rate_limits,
            subject_limits=subject_limits,
            budgets=budgets,
            places=places,
            tracing=tracing,
            max_upstream_connections=self._upstream_connections,
        )
        self._context, self.proxy = ctx, proxy
        asyncio.get_running_loop().call_later(1.0, _settle_collector)
        dispatcher = EventDispatcher(ctx, proxy.post_event, scan_interval=settings.event_scan_seconds)
        tasks = [
            asyncio.create_task(
                watch_database(ctx, interval=settings.change_poll_seconds, stale_seconds=settings.stale_seconds)
            ),
            asyncio.create_task(recorder.run()),
            asyncio.create_task(dispatcher.run()),
        ]
        if ctx.database.is_sqlite:
            tasks.append(asyncio.create_task(ctx.database.checkpoint_wal()))
        # Notices at once, through Redis, else PostgreSQL's LISTEN; the polling above stays the safety net.
        if ctx.fleet is not None:
            tasks.append(asyncio.create_task(ctx.fleet.follow_changes(ctx.access.invalidate)))
            # Keys a provider told to wait rest in every process, not only in the one that was told.
            proxy.key_pools.announce = ctx.fleet.publish_rest
            tasks.append(asyncio.create_task(ctx.fleet.follow_resting(proxy.key_pools.rested_elsewhere)))
        elif ctx.database.can_notify:
            tasks.append(asyncio.create_task(follow_notices(ctx)))
        try:
            yield
        finally:
            self.proxy = None
            for task in tasks:
                task.cancel()
            # Whatever a task ended with, the rest of the shutdown runs (a failure was logged where it happened).
            await asyncio.gather(*tasks, return_exceptions=True)
            await proxy.key_pools.aclose()  # before the database and Redis it writes to close
            if tracing is not None:  # after the recorder's last flush, which ends the spans that waited for tokens
                await asyncio.to_thread(tracing.shutdown)
            for limiter in (shared, subject_shared):
                if limiter is not None:
                    await limiter.aclose()
            if isinstance(budgets, SharedBudgets):  # after the recorder's last flush, which settles
                await budgets.aclose()
            if isinstance(places, SharedPlaces):  # after the requests, which give their places back
                await places.aclose()
            await proxy.upstreams.close()
            if self._given_context is None:
                self._context = None
                await ctx.close()


def _settle_collector() -> None:
    """The objects of start-up (modules, the ORM's and pydantic's) live as long as the process: frozen, out of
    the collector's way. At Python's default threshold (700 allocations) the collector then still took 5% of a
    worker's time under the benchmark's load (perf record); at 10,000, under 0.5%, with the same peak RSS."""
    gc.freeze()
    gc.set_threshold(_YOUNG_COLLECTION_ALLOCATIONS, 10, 10)
