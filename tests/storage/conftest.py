"""Fixtures of the storage tests."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from credgate.storage import Database


@pytest.fixture
async def sqlite_database(tmp_path: Path) -> AsyncIterator[Database]:
    """A migrated SQLite file of this test's own."""
    database = Database(f"sqlite+aiosqlite:///{tmp_path / 'credgate.db'}")
    await database.upgrade()
    yield database
    await database.dispose()
