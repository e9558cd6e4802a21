"""Access: from a project token and a provider name to everything the proxy needs, served from memory.

One indexed query on a miss; the answer is cached until any change (this instance's, at once; another
instance's or the CLI's, within `change_poll_seconds`, by watching the change marker).
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter

from credgate import metrics
from credgate.crypto import hash_token
from credgate.netguard import PrivateNetworks
from credgate.outages import Outage
from credgate.resolved import IdentityProvider, ResolvedIntegration
from credgate.services.budgets import prices_of, rule_of
from credgate.services.context import CHANGE_MARKER, Context, notify_channel
from credgate.services.projects import PROJECT_TOKEN_PREFIX
from credgate.services.provider_keys import usable_keys
from credgate.specs import AuthSpec, Endpoint
from credgate.spending import BudgetRule
from credgate.storage import StorageUnavailable
from credgate.storage.models import Integration, Project

# Entries of the cache that are not a project token's: a project's own (identity tokens), and the directory.
_PROJECT_KEY = "project:"
_DIRECTORY_KEY = ("directory:", "")
_GONE = "gone"  # a project that no longer exists, remembered like an unknown token

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
    """A valid token's project, and its integration for the provider asked (None: not set up)."""

    project_id: str
    token_hash: str  # the project token's (for an identity token: "")
    token_expires_at: datetime | None
    rate_limit_per_minute: int | None
    integration: ResolvedIntegration | None
    budgets: tuple[BudgetRule, ...] = ()  # the project's budgets that apply to this provider
    allowed_origins: frozenset[str] = frozenset()
    subject_rate_limit_per_minute: int | None = None
    max_concurrent_requests: int | None = None


@dataclass(frozen=True, slots=True)
class Directory:
    """What a request that carries no project token needs to know of every project: the origins some project
    lists (a CORS preflight carries no token) and which project trusts which identity provider."""

    origins: frozenset[str]
    identities: dict[tuple[str, str], tuple[str, IdentityProvider]]  # (issuer, audience) → project, provider

    def trusting(self, issuer: str, audiences: tuple[str, ...]) -> tuple[str, IdentityProvider] | None:
        for audience in audiences:
            found = self.identities.get((issuer, audience))
            if found is not None:
                return found
        return None


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
        total_timeout_seconds=integration.total_timeout_seconds,
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


def _access(
    ctx: Context,
    project: Project,
    integration: Integration | None,
    provider: str,
    *,
    token_hash: str = "",
    token_expires_at: datetime | None = None,
) -> Access:
    return Access(
        project_id=project.id,
        token_hash=token_hash,
        token_expires_at=token_expires_at,
        rate_limit_per_minute=project.rate_limit_per_minute,
        budgets=_budgets_for(project, provider),
        integration=None if integration is None else resolved_integration(ctx, integration),
        allowed_origins=frozenset(project.allowed_origins),
        subject_rate_limit_per_minute=project.subject_rate_limit_per_minute,
        max_concurrent_requests=project.max_concurrent_requests,
    )


async def resolve_access(ctx: Context, *, token: str, provider: str) -> Access | None:
    """The access this token grants to `provider`; None when the token is unknown, expired or revoked."""
    if not token.startswith(PROJECT_TOKEN_PREFIX):
        return None
    return await resolve_hashed(ctx, token_hash=hash_token(token), provider=provider)


async def resolve_hashed(ctx: Context, *, token_hash: str, provider: str) -> Access | None:
    """`resolve_access` for the project token of this hash: a client token's minting token."""
    key = (token_hash, provider)
    cache = ctx.access
    cached: object
    if not cache.fresh():
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


async def resolve_for_project(ctx: Context, *, project_id: str, provider: str) -> Access | None:
    """The access an identity token grants: its project's, with no project token involved (None: project gone)."""
    key = (_PROJECT_KEY + project_id, provider)
    cache = ctx.access
    if cache.fresh():
        cached = cache.entries.get(key)
        if cached is not None:
            _HITS.inc()
            return cached if isinstance(cached, Access) else None
    _MISSES.inc()

    async def lookup(generation: int) -> Access | None:
        async with ctx.database.transaction(write=False) as repo:
            found = await repo.resolve_project(project_id=project_id, provider=provider)
        access = None if found is None else _access(ctx, found[0], found[1], provider)
        cache.store(key, access or _GONE, generation=generation)
        return access

    access: Access | None = await _shared(ctx, key, lookup)
    return access


async def directory(ctx: Context) -> Directory:
    """Every project's origins and identity providers, read once per change (one query)."""
    cache = ctx.access
    found = cache.entries.get(_DIRECTORY_KEY)
    if isinstance(found, Directory) and cache.fresh():
        return found

    async def lookup(generation: int) -> Directory:
        async with ctx.database.transaction(write=False) as repo:
            rows = await repo.project_directory()
        origins: set[str] = set()
        identities: dict[tuple[str, str], tuple[str, IdentityProvider]] = {}
        for project_id, allowed, trusted in rows:
            origins.update(allowed)
            if trusted:
                provider = IdentityProvider(**trusted)
                identities[(provider.issuer, provider.audience)] = (project_id, provider)
        read = Directory(origins=frozenset(origins), identities=identities)
        cache.store(_DIRECTORY_KEY, read, generation=generation)
        return read

    result: Directory = await _shared(ctx, _DIRECTORY_KEY, lookup)
    return result


async def _shared(ctx: Context, key: tuple[str, str], load: Callable[[int], Awaitable[Any]]) -> Any:
    """Run `load` once for every request that misses `key` at once (see _shared_lookup)."""
    cache = ctx.access
    generation = cache.generation
    loading_key = (key[0], key[1], generation)
    task = cache.loading.get(loading_key)
    if task is None:
        task = cache.loading[loading_key] = asyncio.ensure_future(load(generation))
        task.add_done_callback(lambda finished: _forget(cache.loading, loading_key, finished))
    done, _ = await asyncio.wait({task}, timeout=LOOKUP_TIMEOUT_SECONDS)
    if not done:
        raise StorageUnavailable("the database did not answer the lookup in time")
    return task.result()


async def _shared_lookup(ctx: Context, *, token_hash: str, provider: str) -> Access | None:
    """Look up, open and cache one entry, once for every request that misses it at once; waited for at most
    LOOKUP_TIMEOUT_SECONDS, so a database that hangs turns into a quick 503 rather than a pile of requests.

    The lookup runs in a task of its own, never cancelled on the spot: cancelling a query on a hung connection
    waits on that connection again (to roll back). A change starts a new generation, so a request that starts
    after a change never joins a lookup that began before it."""
    cache = ctx.access

    async def lookup(generation: int) -> Access | None:
        async with ctx.database.transaction(write=False) as repo:
            row = await repo.resolve(token_hash=token_hash, provider=provider)
        if row.token is None or row.project is None:  # (a token always has its project)
            cache.store_unknown(token_hash, generation=generation)
            return None
        access = _access(
            ctx,
            row.project,
            row.integration,
            provider,
            token_hash=token_hash,
            token_expires_at=row.token.expires_at,
        )
        cache.store((token_hash, provider), access, generation=generation)
        return access

    access: Access | None = await _shared(ctx, (token_hash, provider), lookup)
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
