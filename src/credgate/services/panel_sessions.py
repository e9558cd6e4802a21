"""Panel sign-in: argon2 passwords, server-side sessions with idle and absolute timeouts, and the one-time
setup token that lets the first admin create an account."""

import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from credgate.crypto import hash_token
from credgate.errors import Unauthorized
from credgate.services.admins import new_admin_user
from credgate.services.context import Context
from credgate.storage.models import AdminSession, AdminUser

IDLE_TIMEOUT = timedelta(minutes=30)
ABSOLUTE_TIMEOUT = timedelta(hours=12)
# Handing out or taking away a credential (a key, a token, an admin account) needs the user to have proved who
# they are this recently (ASVS 7.5.1): a session left open on an unattended screen cannot do it.
RECENT_SIGN_IN = timedelta(minutes=15)
SETUP_META_NAME = "setup_token_hash"  # the meta row holding the hash (never the token)
_SEEN_RESOLUTION = timedelta(minutes=1)
_SESSION_ENDED = "the session has ended; sign in again"
_password_hasher = PasswordHasher()


@cache
def _dummy_hash() -> str:
    """Verified against when the user does not exist, so a wrong username costs as much as a wrong password.
    Made at the first sign-in, not at import: argon2 takes 64 MiB to hash."""
    return _password_hasher.hash(secrets.token_urlsafe(16))


@dataclass(frozen=True, slots=True)
class SignedIn:
    """A live session: who, the CSRF token its forms must carry, and when its user last proved who they are."""

    session_id: str
    username: str
    csrf_token: str
    authenticated_at: datetime
    has_password: bool  # else a single sign-on user, who confirms who they are at the identity provider
    role: str = "owner"  # credgate.roles, read anew with each page: a changed role applies at once
    project_ids: tuple[str, ...] = ()

    def signed_in_recently(self, now: datetime) -> bool:
        return now - self.authenticated_at <= RECENT_SIGN_IN


async def sign_in(ctx: Context, *, username: str, password: str) -> tuple[str, SignedIn]:
    """A new session (never a reused one: no fixation) and its cookie secret; Unauthorized otherwise."""
    async with ctx.database.transaction(write=False) as repo:
        user = await repo.find_admin_user(username)
    return await open_session(ctx, _checked(user, password))


def _checked(user: AdminUser | None, password: str) -> AdminUser:
    """`user`, if `password` is theirs; else Unauthorized, in as long whether or not the user exists."""
    try:
        _password_hasher.verify(user.password_hash if user and user.has_password else _dummy_hash(), password)
    except (VerificationError, InvalidHashError):
        raise Unauthorized("wrong username or password") from None
    if user is None or not user.has_password:  # a single sign-on user has no password to guess
        raise Unauthorized("wrong username or password")
    return user


async def confirm_password(ctx: Context, *, session_id: str, password: str) -> None:
    """The session's user proves again who they are with their password; Unauthorized otherwise."""
    session = await _session(ctx, session_id)
    # Checked before the write transaction, which argon2's tenth of a second would otherwise hold open.
    _checked(session.user, password)
    await _confirm(ctx, session, via="password")


async def confirm_single_sign_on(ctx: Context, *, session_id: str, user_id: str) -> None:
    """The session's user has just signed in again at the identity provider (the panel checked when)."""
    session = await _session(ctx, session_id)
    if session.user_id != user_id:
        raise Unauthorized(_SESSION_ENDED)
    await _confirm(ctx, session, via="single sign-on")


async def _session(ctx: Context, session_id: str) -> AdminSession:
    async with ctx.database.transaction(write=False) as repo:
        session = await repo.get_admin_session(session_id)
    if session is None:
        raise Unauthorized(_SESSION_ENDED)
    return session


async def _confirm(ctx: Context, session: AdminSession, *, via: str) -> None:
    actor = f"user:{session.user.username}"
    async with ctx.change(actor=actor, action="panel.confirm", detail={"via": via}) as repo:
        current = await repo.get_admin_session(session.id)
        if current is None:  # ended meanwhile
            raise Unauthorized(_SESSION_ENDED)
        current.authenticated_at = ctx.clock()


async def open_session(
    ctx: Context, user: AdminUser, *, via: str = "password", authenticated_at: datetime | None = None
) -> tuple[str, SignedIn]:
    """A new session for `user`, who has proved who they are (`via` a password or single sign-on), now or at
    `authenticated_at` (through an identity provider's own session)."""
    secret = secrets.token_urlsafe(32)
    now = ctx.clock()
    session = AdminSession(
        id=hash_token(secret),
        user_id=user.id,
        csrf_token=secrets.token_urlsafe(32),
        created_at=now,
        last_seen_at=now,
        authenticated_at=now if authenticated_at is None else min(now, authenticated_at),
    )
    async with ctx.change(actor=f"user:{user.username}", action="panel.sign_in", detail={"via": via}) as repo:
        # Sessions that timed out and were never resumed go here, with their panel state (its secrets included).
        await repo.delete_admin_sessions(last_seen_before=now - IDLE_TIMEOUT, created_before=now - ABSOLUTE_TIMEOUT)
        repo.add(session)
    return secret, _signed_in(session, user)


def _signed_in(session: AdminSession, user: AdminUser) -> SignedIn:
    return SignedIn(
        session_id=session.id,
        username=user.username,
        csrf_token=session.csrf_token,
        authenticated_at=session.authenticated_at,
        role=user.role,
        project_ids=tuple(user.project_ids),
        has_password=user.has_password,
    )


async def resume_session(ctx: Context, *, secret: str) -> SignedIn | None:
    """The session of this cookie secret, unless it is unknown or has timed out (then it is deleted)."""
    now = ctx.clock()
    async with ctx.database.transaction() as repo:
        session = await repo.get_admin_session(hash_token(secret))
        if session is None:
            return None
        if now - session.last_seen_at > IDLE_TIMEOUT or now - session.created_at > ABSOLUTE_TIMEOUT:
            await repo.delete(session)
            return None
        if now - session.last_seen_at > _SEEN_RESOLUTION:
            session.last_seen_at = now
        return _signed_in(session, session.user)


async def sign_out(ctx: Context, *, session_id: str) -> None:
    """End the session; its panel state (services/panel_state.py), on the same row, goes with it."""
    async with ctx.database.transaction() as repo:
        session = await repo.get_admin_session(session_id)
        if session is not None:
            await repo.delete(session)


async def issue_setup_token(ctx: Context) -> str | None:
    """A new one-time setup token while no admin user exists (each start replaces the last); else None."""
    token = secrets.token_urlsafe(32)
    async with ctx.database.transaction() as repo:
        if await repo.count_admin_users() > 0:
            await repo.delete_meta(SETUP_META_NAME)
            return None
        await repo.set_meta(SETUP_META_NAME, hash_token(token))
    return token


async def admin_exists(ctx: Context) -> bool:
    """Whether a panel account exists; until one does, each `credgate serve` prints a one-time setup link."""
    async with ctx.database.transaction(write=False) as repo:
        return await repo.count_admin_users() > 0


async def setup_token_valid(ctx: Context, *, token: str) -> bool:
    async with ctx.database.transaction(write=False) as repo:
        stored = await repo.get_meta(SETUP_META_NAME)
    return stored is not None and hmac.compare_digest(stored, hash_token(token))


async def redeem_setup_token(ctx: Context, *, token: str, username: str, password: str) -> None:
    """Create the first admin with the setup token, which works once: claimed in the same transaction."""
    user = new_admin_user(ctx, username=username, password=password)  # invalid input keeps the link usable
    async with ctx.change(actor="setup-link", action="admin_user.create") as repo:
        if not await repo.delete_meta(SETUP_META_NAME, only_if=hash_token(token)):
            raise Unauthorized("this setup link is not valid any more")
        repo.add(user)
