"""Migration 0011 on a database that already holds audit entries, SQLite and PostgreSQL: they are chained in id
order from the genesis value, the head is stored in meta, and downgrading keeps the entries."""

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from credgate.audit_chain import GENESIS, ChainCheck, format_time
from tests.storage.migrating import columns, migrate

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def events(*extra: str) -> sa.TableClause:
    return sa.table(
        "audit_events",
        sa.column("id", sa.Integer),
        sa.column("at", sa.DateTime(timezone=True)),
        *(sa.column(name, sa.String) for name in ("actor", "action", "project_id", "provider", *extra)),
        sa.column("detail", sa.JSON),
    )


async def test_0011_chains_the_entries_there_are_and_back(database: tuple[str, dict[str, Any]]) -> None:
    engine = create_async_engine(database[0], connect_args=database[1])
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, "0010")
            for number in range(3):
                detail = {"private_networks": ["10.0.0.0/8"]} if number == 1 else None
                await connection.execute(
                    sa.insert(events()).values(
                        at=NOW + timedelta(microseconds=number),
                        actor="t",
                        action=f"action.{number}",
                        project_id="prj_1",
                        provider=None,
                        detail=detail,
                    )
                )
            await connection.run_sync(migrate, "0011")
            chained = events("previous_hash", "hash")
            rows = (await connection.execute(sa.select(chained).order_by(chained.c.id))).mappings().all()
            chain = ChainCheck()
            for row in rows:
                at = row["at"] if row["at"].tzinfo else row["at"].replace(tzinfo=UTC)
                chain.check({**row, "at": format_time(at)})
            assert chain.entries == 3
            assert rows[0]["previous_hash"] == GENESIS
            head = await connection.scalar(sa.text("SELECT value FROM meta WHERE name = 'audit_head'"))
            assert head == rows[-1]["hash"] == chain.head

            await connection.run_sync(migrate, "0010", down=True)
            assert {"previous_hash", "hash"} & await columns(connection, "audit_events") == set()
            assert await connection.scalar(sa.text("SELECT count(*) FROM meta WHERE name = 'audit_head'")) == 0
            assert (
                await connection.execute(sa.text("SELECT action FROM audit_events ORDER BY id"))
            ).scalars().all() == [
                "action.0",
                "action.1",
                "action.2",
            ]
    finally:
        await engine.dispose()


async def test_0011_on_an_empty_log_stores_the_genesis_head(database: tuple[str, dict[str, Any]]) -> None:
    engine = create_async_engine(database[0], connect_args=database[1])
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, "0011")
            assert await connection.scalar(sa.text("SELECT value FROM meta WHERE name = 'audit_head'")) == GENESIS
    finally:
        await engine.dispose()
