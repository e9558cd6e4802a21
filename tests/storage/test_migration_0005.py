"""Migration 0005 on a database that already holds rows, SQLite and PostgreSQL: integrations that exist get no
exception to the SSRF guard (private_networks []), audit events no detail; downgrading keeps the rows."""

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.storage.migrating import columns, migrate

NOW = datetime(2025, 1, 1, tzinfo=UTC)


async def test_0005_gives_existing_integrations_no_exception_and_events_no_detail(
    database: tuple[str, dict[str, Any]],
) -> None:
    engine = create_async_engine(database[0], connect_args=database[1])
    projects = sa.table("projects", *(sa.column(name) for name in ("id", "name", "created_at", "updated_at")))
    integrations = sa.table(
        "integrations",
        *(sa.column(name) for name in ("id", "project_id", "provider", "base_url", "enabled", "timeout_seconds")),
        *(sa.column(name, sa.JSON) for name in ("auth", "templates", "endpoints", "headers", "query")),
        *(sa.column(name) for name in ("stream_idle_timeout_seconds", "created_at", "updated_at")),
    )
    events = sa.table("audit_events", *(sa.column(name) for name in ("at", "actor", "action", "project_id")))
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, "0004")
            await connection.execute(sa.insert(projects).values(id="prj_1", name="p", created_at=NOW, updated_at=NOW))
            row: dict[str, Any] = {"id": "int_1", "project_id": "prj_1", "provider": "acme"}
            row |= {"base_url": "https://api.acme.test", "enabled": True, "timeout_seconds": 600.0}
            row |= {"auth": {"method": "bearer"}, "templates": [], "endpoints": [], "headers": {}, "query": {}}
            row |= {"stream_idle_timeout_seconds": 300.0, "created_at": NOW, "updated_at": NOW}
            await connection.execute(sa.insert(integrations).values(**row))
            await connection.execute(
                sa.insert(events).values(at=NOW, actor="t", action="integration.create", project_id="prj_1")
            )
            await connection.run_sync(migrate, "0005")
            migrated = sa.table("integrations", sa.column("private_networks", sa.JSON))
            found = await connection.execute(sa.select(migrated.c.private_networks))
            assert found.scalars().all() == [[]]
            detail = await connection.execute(sa.text("SELECT detail FROM audit_events"))
            assert detail.scalars().all() == [None]
            await connection.run_sync(migrate, "0004", down=True)
            assert "private_networks" not in await columns(connection, "integrations")
            assert "detail" not in await columns(connection, "audit_events")
            assert (await connection.execute(sa.text("SELECT id FROM integrations"))).all() == [("int_1",)]
    finally:
        await engine.dispose()
