"""Master keys: verify the configured key against the database, and rotate it while the gateway serves."""

import asyncio
import base64

from credgate.config import Settings
from credgate.crypto import DecryptionError, KeyRing, new_master_key
from credgate.errors import StartupError
from credgate.masterkey import master_keys_from_env, read_key_file, write_key_file
from credgate.services.context import Context
from credgate.services.events import reseal_webhook_secrets
from credgate.services.panel_state import reseal_panel_state
from credgate.services.provider_keys import reseal
from credgate.storage import Repository

KEY_CHECK = "master_key_check"
_KEY_CHECK_PLAINTEXT = b"credgate master key check"
_KEY_CHECK_BINDING = b"credgate/v1\x00master-key-check"
_BATCH = 100


def seal_key_check(keyring: KeyRing) -> str:
    return base64.b64encode(keyring.seal(_KEY_CHECK_PLAINTEXT, aad=_KEY_CHECK_BINDING)).decode()


def verify_key_check(keyring: KeyRing, check: str) -> None:
    """Raise StartupError unless the key ring opens what this database was sealed with."""
    try:
        keyring.open(base64.b64decode(check), aad=_KEY_CHECK_BINDING)
    except DecryptionError as error:
        raise StartupError(
            f"the master key does not match this database ({error}). Set CREDGATE_MASTER_KEY, or the key file "
            "in the data dir, to the key the database was created with. Nothing was changed."
        ) from None


async def _reseal_pending(ctx: Context) -> int:
    """Reseal until no secret is left under an older key. A row changed meanwhile is simply found again
    by the next query (under whichever key its writer used), so a concurrent write is never skipped."""
    resealed = 0
    while True:
        ctx.keyring.refresh()
        primary = ctx.keyring.primary_key_id
        async with ctx.database.transaction() as repo:
            keys = await repo.provider_keys_not_under(primary, limit=_BATCH)
            for key in keys:
                if key.ciphertext is None:
                    continue
                ciphertext = reseal(ctx.keyring, key.integration, key.ciphertext)
                if await repo.reseal_provider_key(
                    key, ciphertext=ciphertext, master_key_id=primary, expected=key.ciphertext
                ):
                    resealed += 1
        if not keys:
            return resealed


async def reseal_all(ctx: Context, *, actor: str, settle_seconds: float = 1.0) -> int:
    """Re-encrypt every secret not under the key ring's primary key; returns how many were resealed.

    Batches commit one by one, so the gateway keeps serving. After a first clean pass it waits
    `settle_seconds` and passes again, so a write that read the key ring just before the new key arrived,
    and committed late, is resealed too before the old key can be dropped.
    """
    resealed = await _reseal_pending(ctx) + await reseal_panel_state(ctx) + await reseal_webhook_secrets(ctx)
    await asyncio.sleep(settle_seconds)
    resealed += await _reseal_pending(ctx) + await reseal_panel_state(ctx) + await reseal_webhook_secrets(ctx)
    async with ctx.database.transaction() as repo:
        await repo.set_meta(KEY_CHECK, seal_key_check(ctx.keyring))
        await repo.append_audit_event(at=ctx.clock(), actor=actor, action="master_key.rotate")
    return resealed


async def rotate_master_key(ctx: Context, settings: Settings, *, actor: str) -> int:
    """Rotate the master key; returns how many secrets were resealed.

    With the key file, a new key is generated and put first, everything is resealed, then the old key is
    dropped. With CREDGATE_MASTER_KEY, the operator puts the new key first in the variable (old ones after)
    and this reseals everything under it; the old keys can then be removed from the variable.
    """
    if master_keys_from_env(settings) is not None:
        return await reseal_all(ctx, actor=actor)
    path = settings.master_key_file
    old_keys = read_key_file(path)
    new_key = new_master_key()
    write_key_file(path, [new_key, *old_keys])
    resealed = await reseal_all(ctx, actor=actor)
    write_key_file(path, [new_key])
    ctx.keyring.refresh()
    return resealed


async def ensure_key_check(repo: Repository, keyring: KeyRing) -> None:
    if await repo.get_meta(KEY_CHECK) is None:
        await repo.set_meta(KEY_CHECK, seal_key_check(keyring))
