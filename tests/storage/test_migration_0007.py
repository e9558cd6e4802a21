"""Migration 0007 on a database that already holds keys, SQLite and PostgreSQL: each integration's key becomes the
first key of its pool, with an id of its own and its ciphertext untouched; downgrading keeps the first key of each
pool."""

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.storage.migrating import columns, migrate

NOW = datetime(2025, 1, 1, tzinfo=UTC)
INTEGRATION = ("id", "project_id", "provider", "base_url", "auth", "templates", "endpoints", "headers", "query")


async def test_0007_makes_each_key_the_first_of_its_pool_and_back(database: tuple[str, dict[str, Any]]) -> None:
    engine = create_async_engine(database[0], connect_args=database[1])
    projects = sa.table("projects", *(sa.column(name) for name in ("id", "name", "created_at", "updated_at")))
    integrations = sa.table(
        "integrations",
        *(sa.column(name) for name in (*INTEGRATION[:4], "enabled", "timeout_seconds", "created_at", "updated_at")),
        sa.column("auth", sa.JSON),
        sa.column("templates", sa.JSON),
        sa.column("endpoints", sa.JSON),
        sa.column("headers", sa.JSON),
        sa.column("query", sa.JSON),
        sa.column("private_networks", sa.JSON),
    )
    old_keys = sa.table(
        "provider_keys",
        *(sa.column(name) for name in ("integration_id", "master_key_id", "hint", "updated_at")),
        sa.column("ciphertext", sa.LargeBinary),
    )
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, "0006")
            await connection.execute(sa.insert(projects).values(id="prj_1", name="p", created_at=NOW, updated_at=NOW))
            for provider in ("openai", "anthropic"):
                await connection.execute(
                    sa.insert(integrations).values(
                        id=f"int_{provider}",
                        project_id="prj_1",
                        provider=provider,
                        base_url="https://api.example.com",
                        auth={"method": "bearer"},
                        templates=[],
                        endpoints=[],
                        headers={},
                        query={},
                        private_networks=[],
                        enabled=True,
                        timeout_seconds=600.0,
                        created_at=NOW,
                        updated_at=NOW,
                    )
                )
            await connection.execute(
                sa.insert(old_keys).values(
                    integration_id="int_openai", ciphertext=b"sealed", master_key_id="mk1", hint="…abcd", updated_at=NOW
                )
            )
            await connection.execute(
                sa.insert(old_keys).values(
                    integration_id="int_anthropic", ciphertext=None, master_key_id=None, hint=None, updated_at=NOW
                )
            )

            await connection.run_sync(migrate, "0007")
            found = (
                await connection.execute(
                    sa.text(
                        "SELECT id, integration_id, label, position, ciphertext, master_key_id, hint, disabled, "
                        "failed_at, failure FROM provider_keys ORDER BY integration_id"
                    )
                )
            ).all()
            assert [row[1:] for row in found] == [
                ("int_anthropic", "", 0, None, None, None, False, None, None),
                ("int_openai", "", 0, b"sealed", "mk1", "…abcd", False, None, None),
            ]
            assert all(row[0].startswith("key_") for row in found)
            assert len({row[0] for row in found}) == 2
            strategies = await connection.execute(sa.text("SELECT DISTINCT key_strategy FROM integrations"))
            assert strategies.all() == [("failover",)]

            # A second key in openai's pool: the downgrade keeps the first.
            await connection.execute(
                sa.text(
                    "INSERT INTO provider_keys (id, integration_id, label, position, ciphertext, master_key_id, "
                    "hint, disabled, created_at, updated_at) VALUES ('key_second', 'int_openai', 'b', 1, :c, 'mk1', "
                    "'…wxyz', false, :now, :now)"
                ),
                {"c": b"second", "now": NOW},
            )
            await connection.run_sync(migrate, "0006", down=True)
            assert "key_strategy" not in await columns(connection, "integrations")
            kept = await connection.execute(
                sa.text("SELECT integration_id, ciphertext, hint FROM provider_keys ORDER BY integration_id")
            )
            assert kept.all() == [("int_anthropic", None, None), ("int_openai", b"sealed", "…abcd")]
    finally:
        await engine.dispose()
