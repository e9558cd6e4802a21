"""Provider keys under the master key in the database: binding, rotation while serving, refused restarts."""

import asyncio
import os
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import select, update
from sqlalchemy.engine import make_url

from credgate.config import Settings
from credgate.crypto import DecryptionError, KeyRing, encode_master_key, master_key_id, new_master_key, secret_binding
from credgate.errors import StartupError
from credgate.masterkey import read_key_file, write_key_file
from credgate.services import integrations, projects
from credgate.services.access import resolve_access
from credgate.services.bootstrap import open_context
from credgate.services.context import Context
from credgate.services.master_keys import rotate_master_key
from credgate.services.provider_keys import API_KEY_PURPOSE, seal_provider_key
from credgate.storage.models import Integration, ProviderKey
from tests.secret_sweep import SWEEP
from tests.services.helpers import DatabaseFixture, every_row, opened

KEYS = ["sk-test-masterkeysmasterkeys01", "sk-test-masterkeysmasterkeys02", "sk-test-masterkeysmasterkeys03"]
NEW_KEY = "sk-test-setduringrotation0004"


async def new_project(ctx: Context, *, key: str = KEYS[0], provider: str = "openai") -> tuple[str, str]:
    """A project with one custom integration holding `key`; returns its id and token."""
    SWEEP.register(key)
    project, token = await projects.create_project(ctx, name="demo", actor="tests")
    await add_integration(ctx, project.id, provider=provider, key=key)
    return project.id, token


async def add_integration(ctx: Context, project_id: str, *, provider: str, key: str) -> None:
    await integrations.add_custom_integration(
        ctx, project_id=project_id, provider=provider, base_url="https://api.example.com", api_key=key, actor="t"
    )


async def credential(ctx: Context, token: str, provider: str = "openai") -> str | None:
    access = await resolve_access(ctx, token=token, provider=provider)
    assert access is not None
    assert access.integration is not None
    return access.integration.credential.reveal() if access.integration.credential else None


def with_master_key(settings: Settings, *keys: bytes) -> Settings:
    text = ",".join(encode_master_key(key) for key in keys)
    return settings.model_copy(update={"master_key": SecretStr(text)})


async def stored_keys(ctx: Context) -> list[tuple[str, str, bytes | None, str | None]]:
    """(project id, provider, ciphertext, master key id) of every provider key row."""
    statement = select(Integration.project_id, Integration.provider, ProviderKey.ciphertext, ProviderKey.master_key_id)
    async with ctx.database.engine.connect() as connection:
        result = await connection.execute(statement.join(ProviderKey, ProviderKey.integration_id == Integration.id))
        return [(project_id, provider, ciphertext, key_id) for project_id, provider, ciphertext, key_id in result]


async def all_rows(ctx: Context) -> list[str]:
    async with ctx.database.engine.connect() as connection:
        return await every_row(connection)


def sqlite_files(settings: Settings) -> list[Path]:
    database_file = Path(str(make_url(settings.resolved_database_url).database))
    return [database_file, database_file.with_name(database_file.name + "-wal")]


async def copy_ciphertext(ctx: Context, source: tuple[str, str], target: tuple[str, str]) -> None:
    async with ctx.database.engine.begin() as connection:
        ids = {}
        for project_id, provider in (source, target):
            statement = select(Integration.id).where(
                Integration.project_id == project_id, Integration.provider == provider
            )
            ids[(project_id, provider)] = (await connection.execute(statement)).scalar_one()
        ciphertext = (
            await connection.execute(select(ProviderKey.ciphertext).where(ProviderKey.integration_id == ids[source]))
        ).scalar_one()
        await connection.execute(
            update(ProviderKey).where(ProviderKey.integration_id == ids[target]).values(ciphertext=ciphertext)
        )


async def test_a_ciphertext_copied_to_another_project_does_not_open(ctx: Context) -> None:
    source, source_token = await new_project(ctx, key=KEYS[0])
    target, target_token = await new_project(ctx, key=KEYS[1])
    await copy_ciphertext(ctx, (source, "openai"), (target, "openai"))
    with pytest.raises(DecryptionError):
        await credential(ctx, target_token)
    assert await credential(ctx, source_token) == KEYS[0]


async def test_a_ciphertext_copied_to_another_provider_does_not_open(ctx: Context) -> None:
    project_id, token = await new_project(ctx, key=KEYS[0])
    await add_integration(ctx, project_id, provider="backup", key=KEYS[1])
    await copy_ciphertext(ctx, (project_id, "openai"), (project_id, "backup"))
    with pytest.raises(DecryptionError):
        await credential(ctx, token, "backup")
    assert await credential(ctx, token) == KEYS[0]


async def test_revoking_a_key_destroys_its_ciphertext(ctx: Context) -> None:
    project_id, _ = await new_project(ctx)
    await integrations.revoke_provider_key(ctx, project_id=project_id, provider="openai", actor="tests")
    assert await stored_keys(ctx) == [(project_id, "openai", None, None)]


async def test_no_key_or_token_is_stored_in_plaintext(ctx: Context, settings: Settings, backend: str) -> None:
    project_id, token = await new_project(ctx, key=KEYS[0])
    SWEEP.register(NEW_KEY)
    await integrations.set_provider_key(ctx, project_id=project_id, provider="openai", api_key=NEW_KEY, actor="t")
    plaintexts = [KEYS[0], NEW_KEY, token]
    rows = "\n".join(await all_rows(ctx))
    assert [text for text in plaintexts if text in rows] == []
    if backend != "sqlite":
        return  # the file bytes below are SQLite's; PostgreSQL's rows were searched above
    data = b"".join(path.read_bytes() for path in sqlite_files(settings) if path.exists())
    assert [text for text in plaintexts if text.encode() in data] == []


async def lookups_while(ctx: Context, expected: dict[str, str], task: asyncio.Task[int]) -> int:
    """Serve lookups from the database (cache cleared each round) until `task` ends; returns the rounds."""
    rounds = 0
    while not task.done():
        ctx.access.invalidate()
        assert {token: await credential(ctx, token) for token in expected} == expected
        rounds += 1
    return rounds


async def test_rotating_the_key_file_reseals_every_key_while_another_instance_serves(
    ctx: Context, settings: Settings, database: DatabaseFixture
) -> None:
    expected = {(await new_project(ctx, key=key))[1]: key for key in KEYS}
    old_keys = read_key_file(settings.master_key_file)
    async with opened(settings, database) as other:
        rotation = asyncio.create_task(rotate_master_key(ctx, settings, actor="tests"))
        assert await lookups_while(other, expected, rotation) > 0
        assert await rotation == len(KEYS)
        other.access.invalidate()
        assert {token: await credential(other, token) for token in expected} == expected
    [new_key] = read_key_file(settings.master_key_file)
    assert new_key not in old_keys
    assert {row[3] for row in await stored_keys(ctx)} == {master_key_id(new_key).hex()}
    old_ring = KeyRing(old_keys)
    for project_id, provider, ciphertext, _ in await stored_keys(ctx):
        assert ciphertext is not None
        with pytest.raises(DecryptionError):
            old_ring.open(
                ciphertext, aad=secret_binding(project_id=project_id, provider=provider, purpose=API_KEY_PURPOSE)
            )


async def test_a_key_set_by_another_instance_during_rotation_stays_readable(
    ctx: Context, settings: Settings, database: DatabaseFixture
) -> None:
    project_id, token = await new_project(ctx)
    SWEEP.register(NEW_KEY)
    async with opened(settings, database) as other:
        # What `set_provider_key` does on the other instance, its transaction still open when the rotation starts.
        async with other.database.transaction() as repo:
            integration = await repo.get_integration(project_id, "openai")
            assert integration is not None
            seal_provider_key(other.keyring, integration, NEW_KEY, now=other.clock())
            await repo.flush()
            rotation = asyncio.create_task(rotate_master_key(ctx, settings, actor="tests"))
            await asyncio.wait([rotation], timeout=1.0)
        await rotation
    ctx.access.invalidate()
    assert await credential(ctx, token) == NEW_KEY


async def test_rotating_with_keys_in_the_environment_reseals_under_the_first(
    settings: Settings, database: DatabaseFixture
) -> None:
    old, new = new_master_key(), new_master_key()
    async with opened(with_master_key(settings, old), database) as ctx:
        _, token = await new_project(ctx)
    async with opened(with_master_key(settings, new, old), database) as ctx:
        assert await rotate_master_key(ctx, with_master_key(settings, new, old), actor="tests") == 1
        assert {row[3] for row in await stored_keys(ctx)} == {master_key_id(new).hex()}
    async with opened(with_master_key(settings, new), database) as ctx:
        assert await credential(ctx, token) == KEYS[0]
    assert not settings.master_key_file.exists()


def break_master_key(settings: Settings, how: str) -> Settings:
    """The settings of a restart whose master key is wrong, missing or unreadable."""
    path = settings.master_key_file
    if how == "environment":
        return with_master_key(settings, new_master_key())
    if how == "key file":
        write_key_file(path, [new_master_key()])
    else:
        path.unlink()
        if how == "unreadable":
            path.mkdir()
    return settings


async def state(ctx: Context, settings: Settings, backend: str) -> list[object]:
    """Everything a start could change: rows, the data dir, the key file and (SQLite) the database bytes."""
    key_file = settings.master_key_file
    files: list[object] = [sorted(os.listdir(settings.data_dir)), key_file.is_file() and key_file.read_bytes()]
    if backend == "sqlite":
        files.extend(path.read_bytes() for path in sqlite_files(settings) if path.exists())
    return [await all_rows(ctx), *files]


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("key file", "the master key does not match this database"),
        ("environment", "the master key does not match this database"),
        ("missing", "the database holds secrets, but there is no master key: .*master.key is missing"),
        ("unreadable", "cannot read the master key file .*master.key"),
    ],
)
async def test_a_restart_with_a_bad_master_key_fails_clearly_and_changes_nothing(
    ctx: Context, settings: Settings, database: DatabaseFixture, backend: str, how: str, message: str
) -> None:
    await new_project(ctx)
    restart = break_master_key(settings, how)
    before = await state(ctx, settings, backend)
    with pytest.raises(StartupError, match=message):
        await open_context(restart, connect_args=database[1])
    assert await state(ctx, settings, backend) == before
