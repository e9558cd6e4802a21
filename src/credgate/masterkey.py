"""Where the master keys come from: `CREDGATE_MASTER_KEY` or the key file in the data dir.

Either holds one or more base64url keys, newest first (comma- or line-separated); the first seals, all open.
The file is created on first start with mode 0600 and rewritten atomically by `credgate master-key rotate`.
"""

import os
from pathlib import Path

from credgate.config import Settings
from credgate.crypto import (
    KeyRing,
    MasterKeyFormatError,
    decode_master_key,
    encode_master_key,
    new_master_key,
)
from credgate.errors import StartupError


def parse_master_keys(text: str, *, source: str) -> list[bytes]:
    parts = [part for part in text.replace(",", "\n").split() if part]
    if not parts:
        raise StartupError(f"{source} holds no master key")
    try:
        return [decode_master_key(part) for part in parts]
    except MasterKeyFormatError as error:
        raise StartupError(f"{source}: {error}") from None


def read_key_file(path: Path) -> list[bytes]:
    try:
        text = path.read_text()
    except OSError as error:
        raise StartupError(f"cannot read the master key file {path}: {error.strerror}") from None
    return parse_master_keys(text, source=f"the master key file {path}")


def write_key_file(path: Path, keys: list[bytes]) -> None:
    """Write the key file atomically, readable by its owner only."""
    write_private_file(path, "".join(encode_master_key(key) + "\n" for key in keys))


def write_private_file(path: Path, text: str) -> None:
    """Write a file of the data dir atomically, readable by its owner only (mode 0600)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    # A leftover temporary file would keep its own mode through O_CREAT; start from none.
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def master_keys_from_env(settings: Settings) -> list[bytes] | None:
    if settings.master_key is None:
        return None
    return parse_master_keys(settings.master_key.get_secret_value(), source="CREDGATE_MASTER_KEY")


def load_keyring(settings: Settings) -> KeyRing | None:
    """The key ring of these settings; None when no key is configured or generated yet."""
    env_keys = master_keys_from_env(settings)
    if env_keys is not None:
        return KeyRing(env_keys)
    path = settings.master_key_file
    if not path.exists():
        return None
    return KeyRing(read_key_file(path), reload=lambda: read_key_file(path))


def create_keyring(settings: Settings) -> KeyRing:
    """A key ring with a newly generated key in the key file (first start)."""
    write_key_file(settings.master_key_file, [new_master_key()])
    keyring = load_keyring(settings)
    if keyring is None:
        raise StartupError(f"could not create the master key file {settings.master_key_file}")
    return keyring
