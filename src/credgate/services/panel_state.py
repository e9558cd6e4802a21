"""Panel state: what a panel session carries from one request to the next, kept on its row in the database so that
any worker or instance serves the next step: messages to show once, with a one-time secret (a new project token),
and an Add-new-API set-up awaiting its review. Secrets are sealed under the master key, bound to the session."""

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from credgate.crypto import DecryptionError, KeyRing, Secret, ciphertext_key_id
from credgate.services.context import Context
from credgate.storage.models import AdminSession

logger = logging.getLogger(__name__)
STATE_TTL = timedelta(seconds=600)  # a set-up, or a message never shown, is gone after this
_MAX_MESSAGES = 10
_SHOWN_ONCE_PURPOSE = "one-time-secret"
_SETUP_PURPOSE = "pending-setup"


@dataclass(frozen=True, slots=True)
class PendingSetup:
    """An Add-new-API set-up between "enter key and template" and "review and save"."""

    project_id: str
    provider: str
    template_id: str
    api_key: Secret | None
    base_url: str | None


@dataclass(frozen=True, slots=True)
class Flash:
    """What the session's next page shows once: messages (never a secret), and the one-time secret if any."""

    messages: tuple[str, ...] = ()
    secret: str | None = None


def _binding(session_id: str, purpose: str) -> bytes:
    # A ciphertext copied to another session's row, or to the other column, does not open.
    return b"\x00".join((b"credgate/v1", b"panel-session", session_id.encode(), purpose.encode()))


def _expired(at: datetime | None, now: datetime) -> bool:
    return at is None or now - at > STATE_TTL


def _open(keyring: KeyRing, blob: bytes, *, session_id: str, purpose: str) -> bytes | None:
    try:
        return keyring.open(blob, aad=_binding(session_id, purpose))
    except DecryptionError as error:  # sealed under a master key dropped since: lost, like an expired one
        logger.warning("the panel state of a session could not be opened (%s); it is dropped", error)
        return None


def _clear_flash(session: AdminSession) -> None:
    session.flash_messages, session.flash_secret, session.flash_at = None, None, None


def _clear_setup(session: AdminSession) -> None:
    session.pending_setup, session.pending_setup_at = None, None


async def flash_message(ctx: Context, *, session_id: str, message: str, secret: str | None = None) -> None:
    """Show `message` on the session's next page, and `secret` (kept sealed until then) when given."""
    now = ctx.clock()
    sealed = (
        None if secret is None else ctx.keyring.seal(secret.encode(), aad=_binding(session_id, _SHOWN_ONCE_PURPOSE))
    )
    async with ctx.database.transaction() as repo:
        session = await repo.lock_admin_session(session_id)
        if session is None:
            return
        if _expired(session.flash_at, now):
            _clear_flash(session)
        session.flash_messages = [*(session.flash_messages or []), message][-_MAX_MESSAGES:]
        if sealed is not None:
            session.flash_secret = sealed
        session.flash_at = now


async def take_flash(ctx: Context, *, session_id: str) -> Flash:
    """The session's messages and one-time secret, gone from then on. They are read and cleared in one write
    transaction on the locked row, so of two requests at once only one gets the secret."""
    async with ctx.database.transaction(write=False) as repo:
        found = await repo.get_admin_session(session_id)
        if found is None or found.flash_at is None:
            return Flash()  # the usual case: no write transaction for a page with nothing to show
    now = ctx.clock()
    async with ctx.database.transaction() as repo:
        session = await repo.lock_admin_session(session_id)
        if session is None or session.flash_at is None:
            return Flash()
        fresh = not _expired(session.flash_at, now)
        messages, sealed = session.flash_messages or [], session.flash_secret
        _clear_flash(session)
    if not fresh:
        return Flash()
    secret = None if sealed is None else _open(ctx.keyring, sealed, session_id=session_id, purpose=_SHOWN_ONCE_PURPOSE)
    return Flash(
        messages=tuple(str(message) for message in messages), secret=None if secret is None else secret.decode()
    )


async def hold_setup(ctx: Context, *, session_id: str, setup: PendingSetup) -> None:
    """Keep `setup` for its review, sealed whole, in place of any earlier one; it expires after STATE_TTL."""
    plain = {
        "project_id": setup.project_id,
        "provider": setup.provider,
        "template_id": setup.template_id,
        "api_key": None if setup.api_key is None else setup.api_key.reveal(),
        "base_url": setup.base_url,
    }
    sealed = ctx.keyring.seal(json.dumps(plain).encode(), aad=_binding(session_id, _SETUP_PURPOSE))
    async with ctx.database.transaction() as repo:
        session = await repo.lock_admin_session(session_id)
        if session is not None:
            session.pending_setup, session.pending_setup_at = sealed, ctx.clock()


async def find_pending_setup(ctx: Context, *, session_id: str) -> PendingSetup | None:
    """The session's set-up awaiting review; None when there is none or it expired (then it is deleted)."""
    now = ctx.clock()
    async with ctx.database.transaction() as repo:
        session = await repo.lock_admin_session(session_id)
        if session is None or session.pending_setup is None:
            return None
        if _expired(session.pending_setup_at, now):
            _clear_setup(session)
            return None
        sealed = session.pending_setup
    opened = _open(ctx.keyring, sealed, session_id=session_id, purpose=_SETUP_PURPOSE)
    if opened is None:
        return None
    plain = json.loads(opened)
    api_key = plain["api_key"]
    return PendingSetup(
        project_id=plain["project_id"],
        provider=plain["provider"],
        template_id=plain["template_id"],
        api_key=None if api_key is None else Secret(api_key),
        base_url=plain["base_url"],
    )


async def release_setup(ctx: Context, *, session_id: str) -> None:
    """Delete the session's set-up (it was saved)."""
    async with ctx.database.transaction() as repo:
        session = await repo.lock_admin_session(session_id)
        if session is not None:
            _clear_setup(session)


def _resealed(keyring: KeyRing, blob: bytes, *, session_id: str, purpose: str) -> bytes | None:
    opened = _open(keyring, blob, session_id=session_id, purpose=purpose)
    return None if opened is None else keyring.seal(opened, aad=_binding(session_id, purpose))


async def reseal_panel_state(ctx: Context) -> int:
    """Reseal the sessions' secrets that are not under the primary master key (master-key rotation); returns
    how many were. One that no longer opens is dropped, as if it had expired."""
    ctx.keyring.refresh()
    primary = ctx.keyring.primary_key_id
    resealed = 0
    async with ctx.database.transaction() as repo:
        for session in await repo.lock_admin_sessions_with_sealed_state():
            if session.flash_secret is not None and ciphertext_key_id(session.flash_secret) != primary:
                session.flash_secret = _resealed(
                    ctx.keyring, session.flash_secret, session_id=session.id, purpose=_SHOWN_ONCE_PURPOSE
                )
                resealed += session.flash_secret is not None
            if session.pending_setup is not None and ciphertext_key_id(session.pending_setup) != primary:
                session.pending_setup = _resealed(
                    ctx.keyring, session.pending_setup, session_id=session.id, purpose=_SETUP_PURPOSE
                )
                resealed += session.pending_setup is not None
    return resealed
