"""Opening the gateway's state: master key, database, migrations, catalogue.

A start refuses, changing nothing, when the master key does not open the database, and when the database is
missing or is not the one the data dir belongs to (see `check_database_identity`).
"""

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from credgate.catalog import CatalogError, all_templates
from credgate.config import Settings
from credgate.crypto import KeyRing
from credgate.errors import StartupError
from credgate.fleet import open_fleet
from credgate.masterkey import create_keyring, load_keyring, write_private_file
from credgate.services.context import Context
from credgate.services.master_keys import KEY_CHECK, ensure_key_check, verify_key_check
from credgate.storage import Database, StorageUnavailable
from credgate.storage.database import DATABASE_ID

DATABASE_ID_FILE_NAME = "database.id"
_ID_FILE_HEADER = "# credgate: the id of the database this data dir belongs to; a start refuses any other\n"


@dataclass(frozen=True)
class FoundDatabase:
    """What a start finds in the configured database, before it changes anything."""

    has_schema: bool
    key_check: str | None
    database_id: str | None

    @property
    def is_empty(self) -> bool:
        return self.key_check is None and self.database_id is None


async def open_context(settings: Settings, *, connect_args: Mapping[str, Any] | None = None) -> Context:
    """Check the database and the master key, migrate, and return the services' context.

    Everything is checked before anything is written, so a refused start changes nothing.
    """
    database = Database(settings.resolved_database_url, connect_args=connect_args)
    try:
        return await _open(settings, database)
    except BaseException:
        await database.dispose()
        raise


async def _open(settings: Settings, database: Database) -> Context:
    keyring = load_keyring(settings)
    id_file = database_id_file(settings)
    recorded = read_database_id(id_file)
    try:
        found = await _find(database)
        check_database_identity(settings, database, found, recorded)
        if found.key_check is not None:
            if keyring is None:
                raise StartupError(
                    f"the database holds secrets, but there is no master key: {settings.master_key_file} is missing "
                    "and CREDGATE_MASTER_KEY is not set. Restore the key; nothing was changed."
                )
            verify_key_check(keyring, found.key_check)
        await database.upgrade()
        if keyring is None:
            # Generated only once the database exists: a key file is evidence that a database was created.
            keyring = create_keyring(settings)
        async with database.transaction() as repo:
            await ensure_key_check(repo, keyring)
        database_id = await database.claim_identity(recorded or secrets.token_hex(16))
    except StorageUnavailable as error:
        raise StartupError(f"cannot open the database: {error}") from None
    if database_id != recorded:
        _write_database_id(id_file, database_id)
    return _context(settings, database, keyring)


async def attach_context(settings: Settings, *, database_id: str) -> Context:
    """A worker process's context, once `open_context` has checked, migrated and set up the database in the
    parent: the same database (confirmed by its id) and master key, opened without writing anything, so that
    workers never race on migrations or first-run setup."""
    keyring = load_keyring(settings)
    if keyring is None:
        raise StartupError(f"no master key: {settings.master_key_file} is gone and CREDGATE_MASTER_KEY is not set")
    database = Database(settings.resolved_database_url)
    database.database_id = database_id  # every connection is checked against it, as in the parent
    try:
        await database.ping()
        return _context(settings, database, keyring)
    except StorageUnavailable as error:
        await database.dispose()
        raise StartupError(f"cannot open the database: {error}") from None
    except BaseException:
        await database.dispose()
        raise


def _context(settings: Settings, database: Database, keyring: KeyRing) -> Context:
    try:
        templates = all_templates(settings.data_dir / "templates")
    except CatalogError as error:
        raise StartupError(f"invalid template file: {error}") from None
    fleet = None
    if settings.redis_url is not None:
        # Namespaced by the database: instances share a Redis key space only when they share the database.
        fleet = open_fleet(settings.redis_url.get_secret_value(), namespace=f"credgate:{database.database_id}")
    return Context(
        database=database,
        keyring=keyring,
        templates=templates,
        fleet=fleet,
        allow_private_upstreams=settings.allow_private_upstreams,
        upstream_ports=settings.upstream_port_set,
    )


async def _find(database: Database) -> FoundDatabase:
    if not await database.has_schema():
        return FoundDatabase(has_schema=False, key_check=None, database_id=None)
    async with database.transaction(write=False) as repo:
        return FoundDatabase(
            has_schema=True, key_check=await repo.get_meta(KEY_CHECK), database_id=await repo.get_meta(DATABASE_ID)
        )


def check_database_identity(settings: Settings, database: Database, found: FoundDatabase, recorded: str | None) -> None:
    """Refuse to start on a database that went missing, or that is not the one this data dir belongs to.

    Every database gets a random id when it is created, kept in its `meta` table and, beside the key material,
    in the data dir's `database.id` (mode 0600). The evidence that a database existed for this data dir:

    - `database.id`: the database must be there and carry that id. A database from before ids existed is
      accepted when it holds a master-key check, which the key then has to open (a restored old backup).
    - without it, `master.key`: a start generates the key file only once it has created a database, so a key
      file beside no database means the database went missing (a data dir from before `database.id`). Tables
      with nothing in `meta` are a first start interrupted after its migrations, and it goes on.
    - `CREDGATE_MASTER_KEY` is no evidence on its own: it is set before the very first start too, so it cannot
      tell a first start from a lost database. That is why the id is recorded in the data dir whatever the key's
      source. An instance whose data dir does not persist keeps no evidence: it starts on the database it is
      given, and only the master-key check guards it (against a database sealed under another key).
    """
    id_file = database_id_file(settings)
    key_file = settings.master_key_file
    if recorded is not None:
        if found.database_id is not None and found.database_id != recorded:
            raise StartupError(
                f"the configured database is not this data dir's: {id_file} records database {recorded}, but the "
                f"configured database is {found.database_id}. Check CREDGATE_DATA_DIR and CREDGATE_DATABASE_URL, "
                f"or restore database {recorded}. If this database is really meant to replace it, first move "
                f"{id_file} out of the data dir. Nothing was changed."
            )
        if found.is_empty:
            to_move, them = (f"{id_file} and {key_file}", "them") if key_file.exists() else (str(id_file), "it")
            raise StartupError(
                f"the database is missing: {_no_database_at(database)}, but {id_file} records that this data dir "
                f"belongs to database {recorded}. Restore that database{_sqlite_hint(database)} and start again. "
                f"If a new, empty database is really intended, first move {to_move} out of the data dir and keep "
                f"{them} with the old database's backups. Nothing was changed."
            )
    elif not found.has_schema and key_file.exists():
        raise StartupError(
            f"the database is missing: {_no_database_at(database)}, but the data dir holds the master key "
            f"{key_file}, which is generated with a database. Restore that database{_sqlite_hint(database)} and "
            f"start again. If a new, empty database is really intended, first move {key_file} out of the data dir "
            "and keep it: only it opens the old database's backups. Nothing was changed."
        )


def database_id_file(settings: Settings) -> Path:
    return settings.data_dir / DATABASE_ID_FILE_NAME


def read_database_id(path: Path) -> str | None:
    """The database id recorded in the data dir; None when no start recorded one yet."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise StartupError(f"cannot read the database id file {path}: {error.strerror}") from None
    values = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if len(values) != 1 or len(values[0].split()) != 1:
        raise StartupError(f"the database id file {path} is damaged: restore it from a backup of the data dir")
    return values[0]


def _write_database_id(path: Path, database_id: str) -> None:
    try:
        write_private_file(path, f"{_ID_FILE_HEADER}{database_id}\n")
    except OSError as error:
        raise StartupError(f"cannot write the database id file {path}: {error.strerror}") from None


def _no_database_at(database: Database) -> str:
    if database.file is None:
        return "the configured database (CREDGATE_DATABASE_URL) holds no credgate data"  # the URL may hold a password
    if not database.file.exists():
        return f"the database file {database.file} does not exist"
    return f"the database file {database.file} holds no credgate data"


def _sqlite_hint(database: Database) -> str:
    return f" ({database.file.name} with its -wal file, if it had one)" if database.file is not None else ""
