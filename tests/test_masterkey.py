"""Where the master keys come from: the generated key file (mode 0600) or CREDGATE_MASTER_KEY."""

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from credgate.config import Settings
from credgate.crypto import encode_master_key, master_key_id, new_master_key
from credgate.errors import StartupError
from credgate.masterkey import (
    load_keyring,
    master_keys_from_env,
    parse_master_keys,
    read_key_file,
    write_key_file,
)
from credgate.services.bootstrap import open_context


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that takes nothing away, so a mode of 0600 must come from the code, not the environment."""
    previous = os.umask(0)
    yield
    os.umask(previous)


def file_mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("open_umask")
async def test_the_first_start_creates_an_owner_only_key_file(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    ctx = await open_context(settings)
    await ctx.database.dispose()
    assert file_mode(settings.master_key_file) == 0o600
    assert [master_key_id(key).hex() for key in read_key_file(settings.master_key_file)] == ctx.keyring.key_ids


async def test_a_later_start_keeps_the_key_it_finds(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    first = await open_context(settings)
    await first.database.dispose()
    ctx = await open_context(settings)
    await ctx.database.dispose()
    assert ctx.keyring.key_ids == first.keyring.key_ids


def test_loading_never_creates_a_key_file(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert load_keyring(settings) is None
    assert not settings.master_key_file.exists()


@pytest.mark.usefixtures("open_umask")
@pytest.mark.parametrize("left_behind", ["key file", "temporary file"])
def test_a_rewritten_key_file_is_owner_only(tmp_path: Path, left_behind: str) -> None:
    path = tmp_path / "master.key"
    stale = path if left_behind == "key file" else path.with_name("master.key.tmp")
    stale.write_text("stale\n")
    stale.chmod(0o644)
    write_key_file(path, [new_master_key()])
    assert file_mode(path) == 0o600


async def test_a_key_given_in_the_environment_creates_no_key_file(tmp_path: Path) -> None:
    key = new_master_key()
    settings = Settings(data_dir=tmp_path, master_key=SecretStr(encode_master_key(key)))
    ctx = await open_context(settings)
    await ctx.database.dispose()
    assert ctx.keyring.key_ids == [master_key_id(key).hex()]
    assert not settings.master_key_file.exists()


@pytest.mark.parametrize("separator", [",", "\n", " , ", "\n\n", ",\n"])
def test_keys_are_comma_or_line_separated_newest_first(separator: str) -> None:
    keys = [new_master_key() for _ in range(3)]
    text = separator.join(encode_master_key(key) for key in keys) + "\n"
    assert parse_master_keys(text, source="test") == keys


def test_the_environment_accepts_several_keys(tmp_path: Path) -> None:
    new, old = new_master_key(), new_master_key()
    settings = Settings(data_dir=tmp_path, master_key=SecretStr(f"{encode_master_key(new)},{encode_master_key(old)}"))
    assert master_keys_from_env(settings) == [new, old]


@pytest.mark.parametrize("text", ["", " \n, \n"])
def test_a_source_without_a_key_is_refused(text: str) -> None:
    with pytest.raises(StartupError, match="the master key file x holds no master key"):
        parse_master_keys(text, source="the master key file x")


def test_a_malformed_key_is_refused_without_echoing_it() -> None:
    malformed = encode_master_key(bytes(20))
    with pytest.raises(StartupError, match="CREDGATE_MASTER_KEY: a master key must be 32 bytes") as raised:
        parse_master_keys(f"{encode_master_key(new_master_key())},{malformed}", source="CREDGATE_MASTER_KEY")
    assert malformed not in str(raised.value)


async def test_an_unreadable_key_file_stops_the_start_with_a_clear_message(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    settings.master_key_file.mkdir()  # unreadable as a file, even for root
    with pytest.raises(StartupError, match=r"cannot read the master key file .*master\.key: Is a directory"):
        await open_context(settings)
