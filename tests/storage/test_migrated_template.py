"""The migrated template the `ctx` fixture lays into each test's database (tests/migrated_template.py) is the
schema the migrations make, on SQLite and PostgreSQL: same tables, columns and defaults as the models (which
test_migrations.py proves of the migrations themselves), at the head revision, and a start on it is a normal one."""

import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import create_async_engine

from credgate.config import Settings
from credgate.services.bootstrap import open_context
from credgate.storage.database import MIGRATIONS_DIR
from credgate.storage.models import Base
from tests.migrated_template import lay_in_migrated_schema


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
