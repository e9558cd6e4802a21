"""Opening the gateway's state: master key, database, migrations, catalogue; refuses a wrong master key."""

from collections.abc import Mapping
from typing import Any

from credgate.catalog import CatalogError, all_templates
from credgate.config import Settings
from credgate.errors import StartupError
from credgate.masterkey import create_keyring, load_keyring
from credgate.services.context import Context
from credgate.services.master_keys import KEY_CHECK, ensure_key_check, verify_key_check
from credgate.storage import Database, StorageUnavailable


async def open_context(settings: Settings, *, connect_args: Mapping[str, Any] | None = None) -> Context:
    """Check the master key against the database, migrate it, and return the services' context.

    The key is checked before anything is written, so a start with a wrong key changes nothing.
    """
    database = Database(settings.resolved_database_url, connect_args=connect_args)
    try:
        return await _open(settings, database)
    except BaseException:
        await database.dispose()
        raise


async def _open(settings: Settings, database: Database) -> Context:
    keyring = load_keyring(settings)
    try:
        check = None
        if await database.has_schema():
            async with database.transaction(write=False) as repo:
                check = await repo.get_meta(KEY_CHECK)
        if check is not None:
            if keyring is None:
                raise StartupError(
                    f"the database holds secrets, but there is no master key: {settings.master_key_file} is missing "
                    "and CREDGATE_MASTER_KEY is not set. Restore the key; nothing was changed."
                )
            verify_key_check(keyring, check)
        if keyring is None:
            keyring = create_keyring(settings)
        await database.upgrade()
        async with database.transaction() as repo:
            await ensure_key_check(repo, keyring)
    except StorageUnavailable as error:
        raise StartupError(f"cannot open the database: {error}") from None
    try:
        templates = all_templates(settings.data_dir / "templates")
    except CatalogError as error:
        raise StartupError(f"invalid template file: {error}") from None
    return Context(
        database=database,
        keyring=keyring,
        templates=templates,
        allow_private_upstreams=settings.allow_private_upstreams,
    )
