"""A vanished database is never silent: a start refuses a missing or different database (the data dir records
the database's id), and a running gateway whose database went away answers 503, never 2xx-and-lost."""

import asyncio
import os
import shutil
import sqlite3
import stat
import sys
import threading
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from credgate.cli import main
from credgate.config import Settings
from credgate.crypto import encode_master_key, new_master_key
from credgate.errors import StartupError
from credgate.services import projects
from credgate.services.bootstrap import database_id_file, open_context, read_database_id
from credgate.services.context import Context
from credgate.services.master_keys import KEY_CHECK
from credgate.storage import Database, StorageUnavailable
from credgate.storage.database import DATABASE_ID
from tests.services.helpers import DatabaseFixture, opened


def sqlite_path(database: DatabaseFixture) -> Path | None:
    url = database[0]
    return Path(url.split("///", 1)[1]) if url.startswith("sqlite") else None


def delete_sqlite_files(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


async def wipe(database: DatabaseFixture) -> None:
    """The database gone: SQLite's files deleted, PostgreSQL's schema emptied."""
    path = sqlite_path(database)
    if path is not None:
        delete_sqlite_files(path)
        return
    schema = database[1]["server_settings"]["search_path"]
    engine = create_async_engine(database[0])
    async with engine.begin() as connection:
        await connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        await connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    await engine.dispose()


def data_dir_state(settings: Settings, database: DatabaseFixture) -> list[object]:
    """What a refused start must leave as it was: the data dir's files and bytes, and the SQLite file's absence."""
    files = sorted(settings.data_dir.iterdir())
    path = sqlite_path(database)
    return [[(file.name, file.read_bytes()) for file in files], path is not None and path.exists()]


async def refused(settings: Settings, database: DatabaseFixture, message: str) -> str:
    """Open a context expecting a refusal that changes nothing; return its message."""
    before = data_dir_state(settings, database)
    with pytest.raises(StartupError, match=message) as refusal:
        await open_context(settings, connect_args=database[1])
    assert data_dir_state(settings, database) == before
    return str(refusal.value)


# at start


async def test_a_first_start_records_the_database_id_owner_only(ctx: Context, settings: Settings) -> None:
    path = database_id_file(settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    async with ctx.database.transaction(write=False) as repo:
        assert read_database_id(path) == await repo.get_meta(DATABASE_ID) == ctx.database.database_id


async def test_a_restart_finds_its_database(ctx: Context, settings: Settings, database: DatabaseFixture) -> None:
    async with opened(settings, database) as again:
        assert again.database.database_id == ctx.database.database_id


async def test_a_missing_database_is_refused_and_nothing_is_created(
    ctx: Context, settings: Settings, database: DatabaseFixture
) -> None:
    await ctx.database.dispose()
    await wipe(database)
    message = await refused(settings, database, "the database is missing")
    assert f"records that this data dir belongs to database {ctx.database.database_id}" in message
    assert f"move {database_id_file(settings)} and {settings.master_key_file} out of the data dir" in message
    assert database[0] not in message  # a URL may hold a password


async def test_a_data_dir_from_before_database_ids_refuses_by_its_master_key(
    ctx: Context, settings: Settings, database: DatabaseFixture
) -> None:
    await ctx.database.dispose()
    database_id_file(settings).unlink()
    await wipe(database)
    message = await refused(settings, database, "the database is missing")
    assert f"holds the master key {settings.master_key_file}" in message


async def test_a_different_database_is_refused(
    ctx: Context, settings: Settings, database: DatabaseFixture, tmp_path: Path
) -> None:
    await ctx.database.dispose()
    await wipe(database)
    async with opened(settings.model_copy(update={"data_dir": tmp_path / "other"}), database) as other:
        other_id = other.database.database_id
    message = await refused(settings, database, "the configured database is not this data dir's")
    assert f"records database {ctx.database.database_id}, but the configured database is {other_id}" in message


async def test_the_stated_step_starts_a_new_database(
    ctx: Context, settings: Settings, database: DatabaseFixture, tmp_path: Path
) -> None:
    await ctx.database.dispose()
    await wipe(database)
    for name in (database_id_file(settings).name, settings.master_key_file.name):
        shutil.move(settings.data_dir / name, tmp_path / name)
    async with opened(settings, database) as fresh:
        assert fresh.database.database_id not in (None, ctx.database.database_id)


async def test_a_key_from_the_environment_records_the_id_too(
    settings: Settings, database: DatabaseFixture, tmp_path: Path
) -> None:
    """The variable is set before the first start as well; the id file is the evidence, wherever the key is."""
    from_env = settings.model_copy(update={"master_key": SecretStr(encode_master_key(new_master_key()))})
    async with opened(from_env, database):
        pass
    assert not from_env.master_key_file.exists()
    # another instance, its own data dir: it joins the database and records its id
    async with opened(from_env.model_copy(update={"data_dir": tmp_path / "instance-2"}), database) as second:
        assert read_database_id(tmp_path / "instance-2" / "database.id") == second.database.database_id
    await wipe(database)
    await refused(from_env, database, f"the database is missing.*move {database_id_file(from_env)} out of")


@pytest.mark.parametrize("id_file", ["kept", "none yet"])
async def test_a_database_from_before_ids_is_adopted(
    ctx: Context, settings: Settings, database: DatabaseFixture, id_file: str
) -> None:
    """An upgraded data dir, or an old backup restored beside a newer `database.id`: the master key opens it."""
    async with ctx.database.transaction() as repo:
        assert await repo.delete_meta(DATABASE_ID)
    await ctx.database.dispose()
    if id_file == "none yet":
        database_id_file(settings).unlink()
    async with opened(settings, database) as upgraded:
        assert upgraded.database.database_id is not None
        assert read_database_id(database_id_file(settings)) == upgraded.database.database_id
        assert (upgraded.database.database_id == ctx.database.database_id) == (id_file == "kept")


async def test_a_first_start_interrupted_after_its_migrations_goes_on(
    ctx: Context, settings: Settings, database: DatabaseFixture
) -> None:
    async with ctx.database.transaction() as repo:
        for name in (DATABASE_ID, KEY_CHECK):
            assert await repo.delete_meta(name)
    await ctx.database.dispose()
    database_id_file(settings).unlink()
    async with opened(settings, database) as resumed:
        assert read_database_id(database_id_file(settings)) == resumed.database.database_id is not None


async def test_a_damaged_id_file_is_refused(ctx: Context, settings: Settings, database: DatabaseFixture) -> None:
    database_id_file(settings).write_text("")
    await refused(settings, database, "the database id file .* is damaged")


# the CLI


def test_the_cli_and_the_server_share_a_data_dir_and_refuse_a_deleted_database(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"CREDGATE_DATA_DIR": str(tmp_path / "data")}
    token = runner.invoke(main, ["admin", "create-token"], env=env)
    assert token.exit_code == 0, token.output
    assert runner.invoke(main, ["projects", "create", "demo"], env=env).exit_code == 0
    assert runner.invoke(main, ["projects", "list"], env=env).exit_code == 0
    (tmp_path / "data" / "credgate.db").unlink()
    result = runner.invoke(main, ["projects", "list"], env=env)
    assert result.exit_code == 5
    assert "error: the database is missing: the database file" in result.output
    assert not (tmp_path / "data" / "credgate.db").exists()


# under a running gateway (SQLite: the file; PostgreSQL: the schema)


def service_error_503(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["x-credgate-error"] == "true"
    error = response.json()["error"]
    assert error["status"] == 503
    assert f"request id {response.headers['x-credgate-request-id']}" in error["message"]


async def test_a_running_gateway_whose_database_went_away_answers_503(
    client: httpx.AsyncClient, database: DatabaseFixture
) -> None:
    assert (await client.get("/readyz")).status_code == 200
    await wipe(database)
    assert (await client.get("/readyz")).status_code == 503
    service_error_503(await client.post("/api/v1/projects", json={"name": "lost"}))
    path = sqlite_path(database)
    assert path is None or not path.exists()  # SQLite did not create a new, empty file


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_connecting_never_creates_the_file(ctx: Context, database: DatabaseFixture) -> None:
    path = sqlite_path(database)
    assert path is not None
    await ctx.database.dispose()  # no pooled connection left: the next query connects anew
    await wipe(database)
    threads = set(threading.enumerate())
    with pytest.raises(StorageUnavailable):
        await ctx.database.ping()
    assert not path.exists()
    # aiosqlite stops the thread of a failed connection without waiting for it: let it end in this event loop.
    for thread in set(threading.enumerate()) - threads:
        await asyncio.to_thread(thread.join, 5)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_loss_is_logged_once_naming_the_file(
    client: httpx.AsyncClient, database: DatabaseFixture, caplog: pytest.LogCaptureFixture
) -> None:
    await wipe(database)
    for _ in range(3):
        assert (await client.get("/readyz")).status_code == 503
    errors = [record.getMessage() for record in caplog.records if record.name == "credgate.storage.database"]
    assert errors == [
        f"the database file {sqlite_path(database)} was deleted or replaced: requests that need the "
        "database get 503 until the gateway is restarted"
    ]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_restored_file_is_served_after_a_restart(
    client: httpx.AsyncClient, settings: Settings, database: DatabaseFixture
) -> None:
    path = sqlite_path(database)
    assert path is not None
    assert (await client.post("/api/v1/projects", json={"name": "kept"})).status_code == 201
    backup = path.with_name("backup.db")
    with sqlite3.connect(path) as source, sqlite3.connect(backup) as target:
        source.backup(target)
    await wipe(database)
    service_error_503(await client.post("/api/v1/projects", json={"name": "lost"}))
    os.replace(backup, path)
    # Not under the old connections (SQLite would delete the restored file's -wal as they close): a restart.
    assert (await client.get("/readyz")).status_code == 503
    async with opened(settings, database) as restarted:
        assert [project.name for project in await projects.list_projects(restarted)] == ["kept"]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_file_replaced_by_another_database_answers_503(
    client: httpx.AsyncClient, database: DatabaseFixture, tmp_path: Path
) -> None:
    path = sqlite_path(database)
    assert path is not None
    other = tmp_path / "other.db"
    other_settings = Settings(data_dir=tmp_path / "other", database_url=f"sqlite+aiosqlite:///{other}")
    async with opened(other_settings, ("", {})):
        pass
    os.replace(other, path)
    assert (await client.get("/readyz")).status_code == 503
    service_error_503(await client.post("/api/v1/projects", json={"name": "lost"}))


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_write_whose_file_vanished_before_its_commit_is_not_committed(
    ctx: Context, database: DatabaseFixture
) -> None:
    path = sqlite_path(database)
    assert path is not None
    async with ctx.database.transaction() as repo:
        await repo.set_meta("probe-before", "committed")
    for suffix in ("", "-wal"):  # the same files under other names, to look inside afterwards
        os.link(f"{path}{suffix}", path.with_name(f"kept.db{suffix}"))

    async def write_while_the_file_vanishes() -> None:
        async with ctx.database.transaction() as repo:
            await repo.set_meta("probe-lost", "committed")
            os.unlink(path)

    with pytest.raises(StorageUnavailable, match="was deleted or replaced"):
        await write_while_the_file_vanishes()
    with sqlite3.connect(path.with_name("kept.db")) as kept:
        assert kept.execute("SELECT name FROM meta WHERE name LIKE 'probe%'").fetchall() == [("probe-before",)]


def test_a_database_url_whose_driver_is_missing_names_the_extra_to_install_and_not_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # as if `credgate[postgres]` were not installed
    with pytest.raises(StartupError) as refused:
        Database("postgresql+asyncpg://credgate:hunter2-secret@db.internal/credgate")
    assert "pip install 'credgate[postgres]'" in str(refused.value)
    assert "hunter2" not in str(refused.value)
