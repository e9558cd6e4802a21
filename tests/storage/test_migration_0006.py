"""Migration 0006 on a database that already holds rows, SQLite and PostgreSQL: a session signed in before it
holds no panel state, and downgrading drops the state but keeps the session."""

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.storage.migrating import columns, migrate

NOW = datetime(2025, 1, 1, tzinfo=UTC)
STATE = ("flash_messages", "flash_secret", "flash_at", "pending_setup", "pending_setup_at")


async def test_0006_gives_sessions_that_exist_no_panel_state(database: tuple[str, dict[str, Any]]) -> None:
    engine = create_async_engine(database[0], connect_args=database[1])
    users = sa.table("admin_users", *(sa.column(name) for name in ("id", "username", "password_hash", "created_at")))
    sessions = sa.table(
        "admin_sessions", *(sa.column(name) for name in ("id", "user_id", "csrf_token", "created_at", "last_seen_at"))
    )
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, "0005")
            await connection.execute(
                sa.insert(users).values(id="usr_1", username="a", password_hash="h", created_at=NOW)
            )
            await connection.execute(
                sa.insert(sessions).values(
                    id="s" * 64, user_id="usr_1", csrf_token="c", created_at=NOW, last_seen_at=NOW
                )
            )
            await connection.run_sync(migrate, "0006")
            migrated = sa.table("admin_sessions", *(sa.column(name) for name in ("id", *STATE)))
            found = await connection.execute(sa.select(migrated))
            assert found.all() == [("s" * 64, None, None, None, None, None)]
            await connection.run_sync(migrate, "0005", down=True)
            assert not set(STATE) & await columns(connection, "admin_sessions")
            assert (await connection.execute(sa.text("SELECT id FROM admin_sessions"))).all() == [("s" * 64,)]
    finally:
        await engine.dispose()
