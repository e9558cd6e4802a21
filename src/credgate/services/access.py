"""Access: from a project token and a provider name to everything the proxy needs, served from memory.

One indexed query on a miss; the answer is cached until any change (this instance's, at once; another
instance's or the CLI's, within `change_poll_seconds`, by watching the change marker).
"""

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter

from credgate import metrics
from credgate.crypto import hash_token
from credgate.netguard import PrivateNetworks
from credgate.outages import Outage
from credgate.resolved import ResolvedIntegration
from credgate.services.budgets import prices_of, rule_of
from credgate.services.context import CHANGE_MARKER, Context, notify_channel
from credgate.services.projects import PROJECT_TOKEN_PREFIX
from credgate.services.provider_keys import usable_keys
from credgate.specs import AuthSpec, Endpoint
from credgate.spending import BudgetRule
from credgate.storage import StorageUnavailable
from credgate.storage.models import Integration, Project

# Long enough for a busy but healthy database, short enough that a hung one soon means 503 rather than a queue.
LOOKUP_TIMEOUT_SECONDS = 5.0
# A read of the change marker not answered within this counts as the database not answering.
POLL_TIMEOUT_SECONDS = 2.0

logger = logging.getLogger(__name__)
_HITS, _MISSES = metrics.access_lookups.labels("hit"), metrics.access_lookups.labels("miss")
_auth_adapter: TypeAdapter[AuthSpec] = TypeAdapter(AuthSpec)
_endpoints_adapter = TypeAdapter(tuple[Endpoint, ...])


@dataclass(frozen=True, slots=True)
class Access:
    """A valid project token's project, and its integration for the provider asked (None: not set up)."""

    project_id: str
    token_hash: str
    token_expires_at: datetime | None
    rate_limit_per_minute: int | None
    integration: ResolvedIntegration | None
    budgets: tuple[BudgetRule, ...] = ()  # the project's budgets that apply to this provider


def resolved_integration(ctx: Context, integration: Integration) -> ResolvedIntegration:
    """An integration as the proxy uses it, its keys in service opened."""
    keys = usable_keys(ctx.keyring, integration)
    return ResolvedIntegration(
        provider=integration.provider,
        base_url=integration.base_url,
        auth=_auth_adapter.validate_python(integration.auth),
        endpoints=_endpoints_adapter.validate_python(integration.endpoints),
        headers=dict(integration.headers),
        query=dict(integration.query),
        enabled=integration.enabled,
        timeout_seconds=integration.timeout_seconds,
        stream_idle_timeout_seconds=integration.stream_idle_timeout_seconds,
        credential=keys[0].secret if keys else None,
        private_networks=PrivateNetworks.of(integration.private_networks),
        keys=keys,
        key_strategy=integration.key_strategy,
        prices=prices_of(integration),
    )


def _budgets_for(project: Project | None, provider: str) -> tuple[BudgetRule, ...]:
    if project is None:
        return ()
    return tuple(rule for rule in map(rule_of, project.budgets) if rule.applies_to(provider))


async def resolve_access(ctx: Context, *, token: str, provider: str) -> Access | None:
    """The access this token grants to `provider`; None when the token is unknown, expired or revoked."""
    if not token.startswith(PROJECT_TOKEN_PREFIX):
        return None
    token_hash = hash_token(token)
    key = (token_hash, provider)
    cache = ctx.access
    cached: object
    if cache.stale_after is not None and time.monotonic() > cache.stale_after:
        # Too stale to serve: asked of the database again, which answers (it is back) or fails (503).
        cached = await _shared_lookup(ctx, token_hash=token_hash, provider=provider)
    elif (cached := cache.entries.get(key)) is None:
        if token_hash in cache.unknown:
            _HITS.inc()
            return None
        _MISSES.inc()
        cached = await _shared_lookup(ctx, token_hash=token_hash, provider=provider)
    else:
        _HITS.inc()
    if not isinstance(cached, Access):
        return None
    if cached.token_expires_at is not None and cached.token_expires_at <= ctx.clock():
        return None
    return cached


async def _shared_lookup(ctx: Context, *, token_hash: str, provider: str) -> Access | None:
    """Look up, open and cache one entry, once for every request that misses it at once; waited for at most
    LOOKUP_TIMEOUT_SECONDS, so a database that hangs turns into a quick 503 rather than a pile of requests.

    The lookup runs in a task of its own, never cancelled on the spot: cancelling a query on a hung connection
    waits on that connection again (to roll back). A change starts a new generation, so a request that starts
    after a change never joins a lookup that began before it."""
    cache = ctx.access
    generation = cache.generation
    key = (token_hash, provider, generation)
    task = cache.loading.get(key)
    if task is None:

        async def lookup() -> Access | None:
            async with ctx.database.transaction(write=False) as repo:
                row = await repo.resolve(token_hash=token_hash, provider=provider)
            if row.token is None:
                cache.store_unknown(token_hash, generation=generation)
                return None
            access = Access(
                project_id=row.token.project_id,
                token_hash=token_hash,
                token_expires_at=row.token.expires_at,
                rate_limit_per_minute=row.project.rate_limit_per_minute if row.project else None,
                budgets=_budgets_for(row.project, provider),
                integration=None if row.integration is None else resolved_integration(ctx, row.integration),
            )
            cache.store((token_hash, provider), access, generation=generation)
            return access

        task = cache.loading[key] = asyncio.ensure_future(lookup())
        task.add_done_callback(lambda finished: _forget(cache.loading, key, finished))
    done, _ = await asyncio.wait({task}, timeout=LOOKUP_TIMEOUT_SECONDS)
    if not done:
        raise StorageUnavailable("the database did not answer the lookup in time")
    access: Access | None = task.result()
    return access


def _forget(
    loading: dict[tuple[str, str, int], asyncio.Future[Any]], key: tuple[str, str, int], task: asyncio.Future[Any]
) -> None:
    loading.pop(key, None)
    if not task.cancelled():
        task.exception()  # retrieved: a failure nobody waited for any more is not reported as lost


async def watch_database(ctx: Context, *, interval: float, stale_seconds: float) -> None:
    """Clear the cache whenever another instance or the CLI changes configuration; runs until cancelled.

    Also the judge of the database's health for the proxy: while the marker cannot be read, the cache is served
    for `stale_seconds` after the last read that succeeded, then refused (StorageUnavailable, a 503)."""
    cache = ctx.access
    confirmed = time.monotonic()
    outage = Outage(
        logger,
        down=f"the database does not answer (%s); serving from memory for at most {stale_seconds:g} s",
        back="the database answers again",
        report=metrics.dependency_up.labels("database").set,
    )
    while True:
        started, generation = time.monotonic(), cache.generation
        read = asyncio.ensure_future(_read_marker(ctx))
        try:
            done, _ = await asyncio.wait({read}, timeout=POLL_TIMEOUT_SECONDS)
            if not done:
                # Hung: stale from now on, but waited out rather than cancelled (see _shared_lookup), never doubled.
                cache.stale_after = confirmed + stale_seconds
                await asyncio.wait({read})
        except asyncio.CancelledError:  # shutting down: the read goes too, its connection back to the pool
            read.cancel()
            await asyncio.gather(read, return_exceptions=True)
            raise
        try:
            marker = read.result()
        except Exception as error:  # the next poll retries; the gateway keeps serving from what it knows, a while
            cache.stale_after = confirmed + stale_seconds
            outage.failed(error)
        else:
            confirmed = started
            outage.answered()
            # The first read too: what was cached before it may predate a change. But a read that a clearing
            # overtook may have read the marker before that change: the next poll judges, not this one.
            if marker != cache.marker and cache.generation == generation:
                cache.invalidate(marker)
            cache.stale_after = None
        await asyncio.sleep(interval)


async def follow_notices(ctx: Context) -> None:
    """On PostgreSQL without Redis: clear the cache on every change notice (LISTEN), until cancelled. A lost
    listening connection is logged once and listened again every second; the poll covers the gap."""
    outage = Outage(
        logger,
        down="lost the database's change notices (%s); changes are found by polling",
        back="the database's change notices resumed",
    )

    def heard(marker: str | None) -> None:
        outage.answered()
        ctx.access.invalidate(marker)

    while True:
        try:
            await ctx.database.listen(notify_channel(ctx), heard)
        except Exception as error:  # the driver's own errors too: a dropped connection is not the end
            outage.failed(error)
        await asyncio.sleep(outage.retry_seconds)


async def _read_marker(ctx: Context) -> str | None:
    async with ctx.database.transaction(write=False) as repo:
        return await repo.get_meta(CHANGE_MARKER)
