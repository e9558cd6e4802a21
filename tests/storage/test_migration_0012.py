"""Migration 0012 on a database that already holds admin tokens and users, SQLite and PostgreSQL: they become
owners with no project list, as they were in effect, and downgrading keeps them."""

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.storage.migrating import columns, migrate

NOW = datetime(2025, 1, 1, tzinfo=UTC)


async def test_0012_makes_the_admins_there_are_owners_and_back(database: tuple[str, dict[str, Any]]) -> None:
    engine = create_async_engine(database[0], connect_args=database[1])
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, "0011")
            await connection.execute(
                sa.text(
                    "INSERT INTO admin_tokens (id, name, token_hash, prefix, created_at) "
                    "VALUES ('adm_1', 'ci', :hash, 'cga_abcd', :at)"
                ),
                {"hash": "0" * 64, "at": NOW},
            )
            await connection.execute(
                sa.text(
                    "INSERT INTO admin_users (id, username, password_hash, created_at) "
                    "VALUES ('usr_1', 'ann', 'argon2-hash', :at)"
                ),
                {"at": NOW},
            )
            await connection.run_sync(migrate, "0012")
            for table in ("admin_tokens", "admin_users"):
                row = (await connection.execute(sa.text(f"SELECT role, project_ids FROM {table}"))).one()  # noqa: S608
                assert row[0] == "owner"
                assert row[1] in ([], "[]")  # PostgreSQL's JSON arrives parsed, SQLite's as its text

            await connection.run_sync(migrate, "0011", down=True)
            assert {"role", "project_ids"} & await columns(connection, "admin_users") == set()
            assert await connection.scalar(sa.text("SELECT count(*) FROM admin_tokens")) == 1
    finally:
        await engine.dispose()
