"""Schema migrations on a database that already holds rows, on SQLite and PostgreSQL."""

from datetime import UTC, datetime
from typing import Any
from unittest import mock

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine

from credgate.storage.database import HEAD_REVISION, MIGRATIONS_DIR, _upgrade
from credgate.storage.models import Base
from tests.storage.migrating import columns, migrate

NOW = datetime(2025, 1, 1, tzinfo=UTC)
PROJECTS = sa.table(
    "projects",
    sa.column("id", sa.String),
    sa.column("name", sa.String),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("updated_at", sa.DateTime(timezone=True)),
)
INTEGRATIONS = sa.table(
    "integrations",
    *(sa.column(name, sa.String) for name in ("id", "project_id", "provider", "base_url")),
    *(sa.column(name, sa.JSON) for name in ("auth", "templates", "endpoints", "headers", "query")),
    sa.column("enabled", sa.Boolean),
    sa.column("timeout_seconds", sa.Double),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("updated_at", sa.DateTime(timezone=True)),
)


async def test_0004_gives_integrations_that_exist_a_stream_idle_timeout_of_300(
    database: tuple[str, dict[str, Any]],
) -> None:
    engine = create_async_engine(database[0], connect_args=database[1])
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, "0003")
            await connection.execute(sa.insert(PROJECTS).values(id="prj_1", name="p", created_at=NOW, updated_at=NOW))
            row: dict[str, Any] = {
                "id": "int_1",
                "project_id": "prj_1",
                "provider": "acme",
                "base_url": "https://api.acme.test",
            }
            row |= {"auth": {"method": "bearer"}, "templates": [], "endpoints": [], "headers": {}, "query": {}}
            row |= {"enabled": True, "timeout_seconds": 600.0, "created_at": NOW, "updated_at": NOW}
            await connection.execute(sa.insert(INTEGRATIONS).values(**row))
            await connection.run_sync(migrate, "0004")
            found = await connection.execute(
                sa.text("SELECT timeout_seconds, stream_idle_timeout_seconds FROM integrations")
            )
            assert found.all() == [(600.0, 300.0)]
            await connection.run_sync(migrate, "0003", down=True)
            assert "stream_idle_timeout_seconds" not in await columns(connection, "integrations")
            assert (await connection.execute(sa.text("SELECT id FROM integrations"))).all() == [("int_1",)]
    finally:
        await engine.dispose()


async def test_the_models_are_what_the_migrations_make(database: tuple[str, dict[str, Any]]) -> None:
    """A model changed without a migration (or the other way round) shows here, columns and defaults alike."""
    engine = create_async_engine(database[0], connect_args=database[1])
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, "head")
            differences = await connection.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(sync, opts={"compare_server_default": True}), Base.metadata
                )
            )
        assert differences == []
    finally:
        await engine.dispose()


def test_head_revision_is_alembics_head() -> None:
    """The gateway skips Alembic on a database at HEAD_REVISION: that must be the newest migration, or a new
    one would never run."""
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    assert ScriptDirectory.from_config(config).get_heads() == [HEAD_REVISION]


async def test_a_database_at_head_is_notmigrated_again(tmp_path: Any) -> None:
    """Opening an up-to-date database reads its revision and never calls Alembic; an older one is migrated."""
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, "0004")
            await connection.run_sync(_upgrade)  # behind: migrated
            with mock.patch("alembic.command.upgrade", side_effect=AssertionError("Alembic ran")):
                await connection.run_sync(_upgrade)  # a second start
            version = (await connection.execute(sa.text("SELECT version_num FROM alembic_version"))).scalar()
    finally:
        await engine.dispose()
    assert version == HEAD_REVISION
