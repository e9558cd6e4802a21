"""Context: what every service function needs, built once by `open_context` (the CLI or the app factory)."""

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from credgate.catalog import Template
from credgate.crypto import KeyRing
from credgate.fleet import Fleet
from credgate.storage import Database, Repository

CHANGE_MARKER = "change_marker"
_MAX_ID_LENGTH = 32  # the id columns' width


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def plausible_id(text: str) -> bool:
    """Whether `text` could be an id `new_id` made; what could not is looked up nowhere (a NUL or an unpaired
    surrogate from a URL would make PostgreSQL fail the query rather than find nothing)."""
    return len(text) <= _MAX_ID_LENGTH and text.isascii() and text.isprintable()


class AccessCache:
    """The proxy's resolved lookups in memory; any change clears it (README, Proxy). While the database does not
    answer, it is served for `CREDGATE_STALE_SECONDS` after the last time the database did (`stale_after`).

    `generation` lets a lookup that raced with a change refuse to store what it read before the change.
    Unknown tokens are remembered apart, and fewer, so a flood of made-up tokens cannot evict real entries.
    """

    def __init__(self, *, max_entries: int = 100_000, max_unknown: int = 10_000) -> None:
        self.generation = 0
        self.entries: dict[tuple[str, str], object] = {}
        self.unknown: set[str] = set()
        # Lookups under way, by (token hash, provider, generation): requests that miss at once share one.
        self.loading: dict[tuple[str, str, int], asyncio.Future[Any]] = {}
        self.max_entries = max_entries
        self.max_unknown = max_unknown
        # While the database does not answer: the monotonic time after which entries are too stale to serve.
        self.stale_after: float | None = None
        # The change marker of the newest change this cache was cleared for (None: not known).
        self.marker: str | None = None

    def invalidate(self, marker: str | None = None) -> None:
        """Forget every entry: a change was made. `marker`, the change marker it was made under where known,
        spares the database's watcher a second clearing for the same change."""
        self.generation += 1
        self.entries.clear()
        self.unknown.clear()
        self.marker = marker

    def fresh(self) -> bool:
        """Whether entries may be served: always while the database answers, for a while after it stopped."""
        return self.stale_after is None or time.monotonic() <= self.stale_after

    def store(self, key: tuple[str, str], value: object, *, generation: int) -> None:
        if generation != self.generation:
            return
        if len(self.entries) >= self.max_entries:
            self.entries.clear()  # bounded: a flood of distinct lookups costs queries, never memory
        self.entries[key] = value

    def store_unknown(self, token_hash: str, *, generation: int) -> None:
        if generation != self.generation:
            return
        if len(self.unknown) >= self.max_unknown:
            self.unknown.clear()
        self.unknown.add(token_hash)


@dataclass
class Context:
    database: Database
    keyring: KeyRing
    templates: Mapping[str, Template]
    access: AccessCache = field(default_factory=AccessCache)
    clock: Callable[[], datetime] = utcnow
    allow_private_upstreams: bool = False
    upstream_ports: frozenset[int] = frozenset({443})  # for a public upstream (config.Settings.upstream_ports)
    # The Redis shared with the other workers and instances, if any: changes are announced through it.
    fleet: Fleet | None = None

    @asynccontextmanager
    async def change(
        self,
        *,
        actor: str,
        action: str,
        project_id: str | None = None,
        provider: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[Repository]:
        """A transaction that changes configuration: audited, visible to every instance, cache cleared.

        The audit event and the change marker commit with the change or not at all; this instance's cache is
        cleared after the commit, so requests that start after the response see the change. The other instances
        hear of it at once through the fleet's Redis or PostgreSQL's NOTIFY, else at their next poll of the marker.
        """
        async with self.database.transaction() as repo:
            yield repo
            # Last, for the chain's lock is held from here to the commit. The actor is cut, not refused:
            # "admin-token:" and a name of the longest allowed length is longer than the column.
            await repo.append_audit_event(
                at=self.clock(), actor=actor, action=action, project_id=project_id, provider=provider, detail=detail
            )
            marker = secrets.token_hex(8)
            await repo.set_meta(CHANGE_MARKER, marker)
            await repo.notify(notify_channel(self), marker)
        self.access.invalidate(marker)
        if self.fleet is not None:
            await self.fleet.publish_change(marker)

    async def close(self) -> None:
        """Close the database's connections and Redis's."""
        try:
            await self.database.dispose()
        finally:
            if self.fleet is not None:
                await self.fleet.close()


def notify_channel(ctx: Context) -> str:
    """The PostgreSQL NOTIFY channel of the gateway's database: gateways on other schemas of one PostgreSQL
    database (each has its own id) hear only their own changes."""
    return f"credgate_changes_{ctx.database.database_id or 'new'}"
