"""The SQLite file's connections: given back to the pool rolled back only when a transaction is still open; the one
given back last taken next, each with a bounded page cache."""

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.dialects.sqlite.aiosqlite import AsyncAdapt_aiosqlite_connection

from credgate.storage import Database


@pytest.fixture
def rollbacks(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every rollback asked of aiosqlite (each one a round trip to its thread)."""
    asked: list[object] = []
    rollback = AsyncAdapt_aiosqlite_connection.rollback

    def counted(self: AsyncAdapt_aiosqlite_connection) -> None:
        asked.append(self)
        rollback(self)

    monkeypatch.setattr(AsyncAdapt_aiosqlite_connection, "rollback", counted)
    return asked


async def test_a_committed_transaction_gives_its_connection_back_without_a_rollback(
    sqlite_database: Database, rollbacks: list[object]
) -> None:
    for _ in range(3):
        async with sqlite_database.transaction() as repo:
            await repo.delete_request_records(before=datetime.now(UTC))
        async with sqlite_database.transaction(write=False) as repo:
            await repo.list_request_records("prj_none", limit=1)
    assert rollbacks == []


async def test_a_connection_given_back_in_a_transaction_is_rolled_back(
    sqlite_database: Database, rollbacks: list[object]
) -> None:
    """Begun on the driver's connection, behind SQLAlchemy's back, so that only the pool's reset can end it: the
    row is not kept, and the next write transaction begins (on this connection, SQLite would refuse a BEGIN inside
    a transaction; on another, it would wait for the write lock, then fail)."""
    async with sqlite_database.engine.connect() as connection:
        driver: Any = (await connection.get_raw_connection()).driver_connection
        await driver.execute("BEGIN IMMEDIATE")
        await driver.execute("INSERT INTO meta (name, value) VALUES ('left', 'open')")
    assert len(rollbacks) == 1
    async with sqlite_database.transaction() as repo:
        await repo.delete_request_records(before=datetime.now(UTC))
    async with sqlite_database.engine.connect() as connection:
        assert (await connection.scalar(text("SELECT count(*) FROM meta WHERE name = 'left'"))) == 0


async def test_the_pool_hands_out_the_connection_given_back_last_and_each_caches_512_kib(
    sqlite_database: Database,
) -> None:
    """A gateway's memory: with the pool's first-in first-out order, every pooled connection took turns and each
    filled SQLite's default page cache (2 MB, in the malloc arena of its own thread) as the request log grew."""
    engine = sqlite_database.engine
    async with engine.connect() as first, engine.connect() as second:
        first_driver = (await first.get_raw_connection()).driver_connection
        second_driver = (await second.get_raw_connection()).driver_connection
        assert first_driver is not second_driver
        for connection in (first, second):
            assert (await connection.scalar(text("PRAGMA cache_size"))) == -512
    # `second` was given back first (the inner block of the two ends first), `first` last.
    for _ in range(3):
        async with engine.connect() as connection:
            assert (await connection.get_raw_connection()).driver_connection is first_driver


async def test_an_in_memory_database_opens() -> None:
    """Its pool (SQLAlchemy's StaticPool: one connection) refuses a file's options."""
    database = Database("sqlite+aiosqlite://")
    try:
        async with database.engine.connect() as connection:
            assert (await connection.scalar(text("PRAGMA cache_size"))) == -512
    finally:
        await database.dispose()
