"""Admins: API tokens (`cga_…`) for the admin API and CLI scripts, and panel users with argon2 passwords."""

from datetime import timedelta

from argon2 import PasswordHasher

from credgate.crypto import generate_token, hash_token
from credgate.errors import Conflict, InvalidInput, Unauthorized
from credgate.limits import Name, Password, within
from credgate.services.context import Context, new_id
from credgate.storage.models import AdminToken, AdminUser

ADMIN_TOKEN_PREFIX = "cga_"  # noqa: S105 - a public prefix, not a secret
_LAST_USED_RESOLUTION = timedelta(minutes=1)  # coarse, so reads do not turn into a write each time
_password_hasher = PasswordHasher()


async def create_admin_token(ctx: Context, *, name: str, actor: str) -> str:
    """Issue an admin token; its value is returned only here."""
    name = within("name", Name, name)
    secret = generate_token(ADMIN_TOKEN_PREFIX)
    token = AdminToken(
        id=new_id("adm"), name=name, token_hash=hash_token(secret), prefix=secret[:8], created_at=ctx.clock()
    )
    async with ctx.change(actor=actor, action="admin_token.create") as repo:
        repo.add(token)
    return secret


async def authenticate_admin(ctx: Context, *, token: str | None) -> AdminToken:
    """The admin token this secret names, or Unauthorized."""
    if not token or not token.startswith(ADMIN_TOKEN_PREFIX):
        raise Unauthorized("invalid admin token")
    async with ctx.database.transaction(write=False) as repo:
        admin = await repo.find_admin_token(hash_token(token))
    if admin is None:
        raise Unauthorized("invalid admin token")
    now = ctx.clock()
    if admin.last_used_at is None or now - admin.last_used_at > _LAST_USED_RESOLUTION:
        async with ctx.database.transaction() as repo:
            found = await repo.find_admin_token(admin.token_hash)
            if found is not None:
                found.last_used_at = now
    return admin


def new_admin_user(ctx: Context, *, username: str, password: str) -> AdminUser:
    """A validated user row with its password hashed (argon2id); not stored yet."""
    username = within("username", Name, username.strip())
    if any(char.isspace() for char in username):
        raise InvalidInput("username", "may not hold white space")
    within("password", Password, password)
    return AdminUser(
        id=new_id("usr"), username=username, password_hash=_password_hasher.hash(password), created_at=ctx.clock()
    )


async def create_admin_user(ctx: Context, *, username: str, password: str, actor: str) -> AdminUser:
    """Create a panel login; the password is stored only as an argon2id hash."""
    user = new_admin_user(ctx, username=username, password=password)
    async with ctx.change(actor=actor, action="admin_user.create") as repo:
        if await repo.find_admin_user(user.username) is not None:
            raise Conflict(f"user {user.username} already exists")
        repo.add(user)
    return user
