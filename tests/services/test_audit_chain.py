"""The audit log's hash chain in the database, SQLite and PostgreSQL: concurrent changes, of one instance or two,
make one unbroken chain; the export is that chain; the stored chain's check finds an edited, deleted or missing
entry."""

import asyncio
import json

import pytest
from sqlalchemy import text

from credgate.audit_chain import GENESIS, verify_lines
from credgate.config import Settings
from credgate.errors import InvalidInput
from credgate.services import audit, projects
from credgate.services.context import Context
from tests.services.helpers import DatabaseFixture, opened


async def create_projects(ctx: Context, count: int, prefix: str = "p") -> None:
    await asyncio.gather(*(projects.create_project(ctx, name=f"{prefix}{n}", actor="tests") for n in range(count)))


async def exported(ctx: Context, *, page_size: int = 1000) -> list[str]:
    return [line async for line in audit.export_audit_log(ctx, page_size=page_size)]


async def execute(ctx: Context, statement: str) -> None:
    async with ctx.database.engine.begin() as connection:
        await connection.execute(text(statement))


async def test_concurrent_changes_make_one_unbroken_chain(ctx: Context) -> None:
    await create_projects(ctx, 20)
    verdict = await audit.verify_audit_log(ctx)
    assert (verdict.verified, verdict.entries) == (True, 20)
    assert verify_lines(await exported(ctx)).head == verdict.head


async def test_two_instances_writing_at_once_make_one_unbroken_chain(
    ctx: Context, settings: Settings, database: DatabaseFixture
) -> None:
    async with opened(settings, database) as other:
        await asyncio.gather(create_projects(ctx, 10, "a"), create_projects(other, 10, "b"))
        verdict = await audit.verify_audit_log(other)
    assert (verdict.verified, verdict.entries) == (True, 20)


async def test_the_export_is_the_chain_oldest_first_a_page_at_a_time(ctx: Context) -> None:
    await create_projects(ctx, 5)
    lines = await exported(ctx, page_size=2)
    entries = [json.loads(line) for line in lines]
    assert [entry["id"] for entry in entries] == sorted(entry["id"] for entry in entries)
    assert entries[0]["previous_hash"] == GENESIS
    assert set(entries[0]) == {
        "id",
        "at",
        "actor",
        "action",
        "project_id",
        "provider",
        "detail",
        "previous_hash",
        "hash",
    }
    assert verify_lines(lines).entries == 5
    assert lines == await exported(ctx)


async def test_the_export_holds_the_entries_there_were_when_it_started(ctx: Context) -> None:
    await create_projects(ctx, 3)
    lines = audit.export_audit_log(ctx, page_size=1)
    first = await anext(lines)
    await create_projects(ctx, 2, "later")
    assert len([first, *[line async for line in lines]]) == 3


async def test_a_refused_change_leaves_the_chain_as_it_was(ctx: Context) -> None:
    await create_projects(ctx, 1)
    before = await audit.verify_audit_log(ctx)
    with pytest.raises(InvalidInput):
        await projects.create_project(ctx, name="", actor="tests")
    after = await audit.verify_audit_log(ctx)
    assert (after.verified, after.entries, after.head) == (True, 1, before.head)


async def test_an_edited_entry_is_named_by_its_id(ctx: Context) -> None:
    await create_projects(ctx, 3)
    await execute(ctx, "UPDATE audit_events SET actor = 'someone else' WHERE id = 2")
    verdict = await audit.verify_audit_log(ctx)
    assert (verdict.verified, verdict.entry_id, verdict.entries) == (False, 2, 1)
    assert verdict.problem == "hash mismatch: the entry was edited"


async def test_a_deleted_entry_breaks_the_one_after_it(ctx: Context) -> None:
    await create_projects(ctx, 3)
    await execute(ctx, "DELETE FROM audit_events WHERE id = 2")
    verdict = await audit.verify_audit_log(ctx)
    assert (verdict.verified, verdict.entry_id) == (False, 3)
    assert verdict.problem is not None
    assert verdict.problem.startswith("previous_hash mismatch")


async def test_entries_removed_from_the_end_are_found_by_the_stored_head(ctx: Context) -> None:
    await create_projects(ctx, 3)
    await execute(ctx, "DELETE FROM audit_events WHERE id = 3")
    verdict = await audit.verify_audit_log(ctx)
    assert (verdict.verified, verdict.entries, verdict.entry_id) == (False, 2, None)
    assert verdict.problem is not None
    assert "removed from the end" in verdict.problem


async def test_a_missing_head_is_reported_then_made_again_by_the_next_change(ctx: Context) -> None:
    await create_projects(ctx, 2)
    await execute(ctx, "DELETE FROM meta WHERE name = 'audit_head'")
    assert (await audit.verify_audit_log(ctx)).problem == "the stored head (meta audit_head) is missing"
    await create_projects(ctx, 1, "after")
    verdict = await audit.verify_audit_log(ctx)
    assert (verdict.verified, verdict.entries) == (True, 3)


async def test_a_long_actor_is_cut_before_it_is_hashed(ctx: Context) -> None:
    await projects.create_project(ctx, name="p", actor="a" * 500)
    assert (await audit.verify_audit_log(ctx)).verified
    assert len(json.loads((await exported(ctx))[0])["actor"]) < 500
