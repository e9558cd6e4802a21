"""Audit: the record of every change, newest first; it never holds a secret.

The entries form a hash chain (credgate.audit_chain), written by `Repository.append_audit_event` alone. Here: the
export of the whole chain, oldest first, and the check of the chain stored in the database.
"""

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from credgate.audit_chain import ChainBroken, ChainCheck, format_time
from credgate.limits import ListLimit, within
from credgate.services.context import Context, plausible_id
from credgate.storage.models import AuditEvent

EXPORT_PAGE = 1000  # entries read per transaction by the export


@dataclass(frozen=True, slots=True)
class ChainVerdict:
    """The stored chain's check: the entries that held and the last one's hash, or where and why it broke."""

    verified: bool
    entries: int
    head: str
    entry_id: int | None = None  # the entry that broke the chain (None: the chain held, or its end is wrong)
    problem: str | None = None


async def list_audit_events(ctx: Context, *, limit: int = 100, project_id: str | None = None) -> Sequence[AuditEvent]:
    within("limit", ListLimit, limit)
    if project_id is not None and not plausible_id(project_id):
        return []  # no project has such an id, so none of its events are
    async with ctx.database.transaction(write=False) as repo:
        return await repo.list_audit_events(limit=limit, project_id=project_id)


def export_record(event: AuditEvent) -> dict[str, Any]:
    """An entry as a line of the export holds it: its fields, `at` as the chain's text, and the two hashes."""
    return {
        "id": event.id,
        "at": format_time(event.at),
        "actor": event.actor,
        "action": event.action,
        "project_id": event.project_id,
        "provider": event.provider,
        "detail": event.detail,
        "previous_hash": event.previous_hash,
        "hash": event.hash,
    }


async def export_audit_log(ctx: Context, *, page_size: int = EXPORT_PAGE) -> AsyncIterator[str]:
    """Every entry there is when the export starts, oldest first (the chain's order): JSON Lines, each line an
    `export_record` and its newline.

    Read a page at a time, each in a short transaction of its own: no transaction stays open while the reader
    takes its time, and a million entries are never in memory at once.
    """
    async with ctx.database.transaction(write=False) as repo:
        _, newest = await repo.audit_head()
    async for event in _entries(ctx, up_to_id=newest, page_size=page_size):
        yield json.dumps(export_record(event), ensure_ascii=False, separators=(",", ":")) + "\n"


async def verify_audit_log(ctx: Context, *, page_size: int = EXPORT_PAGE) -> ChainVerdict:
    """Check the chain stored in the database: every entry's hash, every link, and that the stored head is the
    newest entry's hash (else entries were removed from the end, or the head was edited)."""
    async with ctx.database.transaction(write=False) as repo:
        stored_head, newest = await repo.audit_head()
    chain = ChainCheck()
    async for event in _entries(ctx, up_to_id=newest, page_size=page_size):
        try:
            chain.check(export_record(event))
        except ChainBroken as broken:
            return ChainVerdict(False, chain.entries, chain.head, entry_id=event.id, problem=broken.problem)
    if stored_head is None:
        return ChainVerdict(False, chain.entries, chain.head, problem="the stored head (meta audit_head) is missing")
    if stored_head != chain.head:
        problem = "the stored head is not the newest entry's hash: entries were removed from the end, or it was edited"
        return ChainVerdict(False, chain.entries, chain.head, problem=problem)
    return ChainVerdict(True, chain.entries, chain.head)


async def _entries(ctx: Context, *, up_to_id: int, page_size: int) -> AsyncIterator[AuditEvent]:
    after = 0
    while after < up_to_id:
        async with ctx.database.transaction(write=False) as repo:
            page = await repo.audit_chain_page(after_id=after, up_to_id=up_to_id, limit=page_size)
        if not page:
            return
        for event in page:
            yield event
        after = page[-1].id
