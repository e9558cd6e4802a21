"""The migrated template the `ctx` fixture lays into each test's database (tests/migrated_template.py) is the
schema the migrations make, on SQLite and PostgreSQL: same tables, columns and defaults as the models (which
test_migrations.py proves of the migrations themselves), at the head revision, and a start on it is a normal one.
On PostgreSQL a schema a test is done with serves the next test only if it is brought back to that template."""

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from credgate.config import Settings
from credgate.services import integrations, projects
from credgate.services.bootstrap import open_context
from credgate.storage.database import MIGRATIONS_DIR
from credgate.storage.models import Base
from tests.conftest import POSTGRES_URL
from tests.migrated_template import PostgresSchemas, lay_in_migrated_schema
from tests.services.helpers import every_row


async def test_the_template_is_the_schema_the_migrations_make(
    database: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    await lay_in_migrated_schema(*database)
    engine = create_async_engine(database[0], connect_args=database[1])
    try:
        async with engine.connect() as connection:
            differences = await connection.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(sync, opts={"compare_server_default": True}), Base.metadata
                )
            )
            version = await connection.scalar(sa.text("SELECT version_num FROM alembic_version"))
    finally:
        await engine.dispose()
    assert differences == []
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    assert version == ScriptDirectory.from_config(config).get_current_head()

    settings = Settings(data_dir=tmp_path / "data", database_url=database[0])
    context = await open_context(settings, connect_args=database[1])  # finds nothing to migrate, claims an id
    try:
        assert context.database.database_id is not None
    finally:
        await context.database.dispose()
    if database[0].startswith("sqlite"):
        assert os.stat(database[0].split("///", 1)[1]).st_mode & 0o777 == 0o600


async def test_a_database_that_already_has_tables_is_left_as_it_is(database: tuple[str, dict[str, Any]]) -> None:
    await lay_in_migrated_schema(*database)
    engine = create_async_engine(database[0], connect_args=database[1])
    try:
        async with engine.begin() as connection:
            await connection.execute(sa.text("INSERT INTO meta (name, value) VALUES ('kept', 'yes')"))
        await lay_in_migrated_schema(*database)
        async with engine.connect() as connection:
            assert await connection.scalar(sa.text("SELECT value FROM meta WHERE name = 'kept'")) == "yes"
    finally:
        await engine.dispose()


POSTGRES_ONLY = pytest.mark.parametrize("backend", ["postgresql"])


@pytest.fixture
async def schemas(backend: str) -> AsyncIterator[PostgresSchemas]:
    """A pool of its own, so that the test sees each schema it hands out."""
    assert POSTGRES_URL is not None
    pool = PostgresSchemas(POSTGRES_URL)
    try:
        yield pool
    finally:
        await asyncio.to_thread(pool.close)


def engine_on(schema: str) -> AsyncEngine:
    assert POSTGRES_URL is not None
    return create_async_engine(POSTGRES_URL, connect_args={"server_settings": {"search_path": schema}})


async def stored(schema: str) -> tuple[list[str], list[str]]:
    """The schema's Alembic version rows, and every row of every table."""
    engine = engine_on(schema)
    try:
        async with engine.connect() as connection:
            versions = [row for (row,) in await connection.execute(sa.text("SELECT version_num FROM alembic_version"))]
            return versions, await every_row(connection)
    finally:
        await engine.dispose()


@POSTGRES_ONLY
async def test_a_used_schema_is_handed_out_again_as_the_migrations_left_it(
    schemas: PostgresSchemas, tmp_path: Path
) -> None:
    fresh = await schemas.take(migrated=True)
    as_migrated = await stored(fresh)
    assert as_migrated[0]  # the migrations' own rows, to be kept: Alembic's version, the audit chain's head
    assert as_migrated[1]
    assert POSTGRES_URL is not None
    settings = Settings(data_dir=tmp_path / "data", database_url=POSTGRES_URL)
    ctx = await open_context(settings, connect_args={"server_settings": {"search_path": fresh}})
    try:
        created, _ = await projects.create_project(ctx, name="used", actor="t")
        await integrations.add_template_integration(
            ctx,
            project_id=created.id,
            provider="openai",
            template_id="openai-chat-completions",
            api_key="sk-used-0123456789",
            actor="t",
        )
    finally:
        await ctx.database.dispose()
    assert await stored(fresh) != as_migrated
    await schemas.give_back(fresh)

    again = await schemas.take(migrated=True)
    assert again == fresh
    assert await stored(again) == as_migrated
    engine = engine_on(again)
    try:
        async with engine.connect() as connection:  # the ids start over, as in a new schema
            assert await connection.scalar(sa.text("SELECT nextval('audit_events_id_seq')")) == 1
    finally:
        await engine.dispose()
    await schemas.give_back(again)


@POSTGRES_ONLY
async def test_a_schema_whose_shape_changed_or_that_was_never_migrated_is_dropped(schemas: PostgresSchemas) -> None:
    altered, empty = await schemas.take(migrated=True), await schemas.take(migrated=False)
    engine = engine_on(altered)
    try:
        async with engine.begin() as connection:
            await connection.execute(sa.text("CREATE INDEX ix_meta_value ON meta (value)"))
    finally:
        await engine.dispose()
    await schemas.give_back(altered)
    await schemas.give_back(empty)
    engine = engine_on("public")
    try:
        async with engine.connect() as connection:
            query = "SELECT count(*) FROM pg_namespace WHERE nspname IN (:altered, :empty)"
            assert await connection.scalar(sa.text(query), {"altered": altered, "empty": empty}) == 0
    finally:
        await engine.dispose()
    assert await schemas.take(migrated=True) not in (altered, empty)
