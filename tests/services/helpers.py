"""Helpers shared by the service tests."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from credgate.config import Settings
from credgate.services.bootstrap import open_context
from credgate.services.context import Context
from credgate.storage.models import Base

DatabaseFixture = tuple[str, dict[str, Any]]  # the `database` fixture: URL and connect args


@asynccontextmanager
async def opened(settings: Settings, database: DatabaseFixture) -> AsyncIterator[Context]:
    """Another Context on the same database: another instance, a restart, or the CLI."""
    other = await open_context(settings, connect_args=database[1])
    try:
        yield other
    finally:
        await other.database.dispose()


async def every_row(connection: AsyncConnection) -> list[str]:
    """Every row of every table, as text, sorted: to compare what a database holds, or to search it."""
    rows = [
        repr(tuple(row)) for table in Base.metadata.sorted_tables for row in await connection.execute(select(table))
    ]
    return sorted(rows)
