"""Admins: API tokens (`cga_…`) for the admin API and CLI scripts, and panel users with argon2 passwords; listed,
given roles and removed by an owner, never leaving the gateway without one."""

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from argon2 import PasswordHasher

from credgate.crypto import generate_token, hash_token
from credgate.errors import Conflict, InvalidInput, NotFound, Unauthorized
from credgate.limits import Name, Password, within
from credgate.roles import Principal, Role, checked_grant
from credgate.services.context import Context, new_id, plausible_id
from credgate.storage import DuplicateRow, Repository
from credgate.storage.models import AdminToken, AdminUser

ADMIN_TOKEN_PREFIX = "cga_"  # noqa: S105 - a public prefix, not a secret
_LAST_USED_RESOLUTION = timedelta(minutes=1)  # coarse, so reads do not turn into a write each time
_password_hasher = PasswordHasher()


async def create_admin_token(
    ctx: Context, *, name: str, actor: str, role: str = Role.OWNER, project_ids: Iterable[str] = ()
) -> str:
    """Issue an admin token with its role (credgate.roles); its value is returned only here."""
    _, secret = await issue_admin_token(ctx, name=name, actor=actor, role=role, project_ids=project_ids)
    return secret


async def issue_admin_token(
    ctx: Context, *, name: str, actor: str, role: str = Role.OWNER, project_ids: Iterable[str] = ()
) -> tuple[AdminToken, str]:
    """Issue an admin token with its role: the row, and its value, which is returned only here."""
    name = within("name", Name, name)
    role, granted = checked_grant(role, project_ids)
    secret = generate_token(ADMIN_TOKEN_PREFIX)
    token = AdminToken(
        id=new_id("adm"),
        name=name,
        token_hash=hash_token(secret),
        prefix=secret[:8],
        created_at=ctx.clock(),
        role=role.value,
        project_ids=granted,
    )
    async with ctx.change(actor=actor, action="admin_token.create", detail=_grant(role, granted)) as repo:
        await _require_projects(repo, granted)
        repo.add(token)
    return token, secret


async def _require_projects(repo: Repository, project_ids: list[str]) -> None:
    for project_id in project_ids:
        if not plausible_id(project_id):  # looked up nowhere, nor repeated
            raise InvalidInput("project_ids", "holds an id that names no project")
        if await repo.get_project(project_id) is None:
            raise InvalidInput("project_ids", f"no project {project_id}")


def _grant(role: Role, project_ids: list[str], **named: str) -> dict[str, Any]:
    """The audit entry's detail of an admin given a role: the role and its projects (and whom, when changed)."""
    return {**named, "role": role.value, "project_ids": project_ids}


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


async def authenticate_bearer(ctx: Context, authorization: str) -> Principal:
    """The principal of an `Authorization: Bearer <admin token>` header, or Unauthorized with the header that
    says how to authenticate."""
    scheme, _, token = authorization.partition(" ")
    try:
        admin = await authenticate_admin(ctx, token=token.strip() if scheme.lower() == "bearer" else None)
    except Unauthorized as error:
        error.headers["WWW-Authenticate"] = "Bearer"
        raise
    return Principal.of(actor=f"admin-token:{admin.name}", role=admin.role, project_ids=admin.project_ids)


def new_admin_user(
    ctx: Context, *, username: str, password: str | None, role: str = Role.OWNER, project_ids: Iterable[str] = ()
) -> AdminUser:
    """A validated user row with its password hashed (argon2id) and its role checked; not stored yet.
    With no password, the user signs in only through the identity provider (README, Single sign-on)."""
    username = within("username", Name, username.strip())
    if password is None:
        username = username.lower()  # an email address, as single sign-on compares it
    if any(char.isspace() for char in username):
        raise InvalidInput("username", "may not hold white space")
    if password is not None:
        within("password", Password, password)
    checked, granted = checked_grant(role, project_ids)
    return AdminUser(
        id=new_id("usr"),
        username=username,
        password_hash="" if password is None else _password_hasher.hash(password),
        created_at=ctx.clock(),
        role=checked.value,
        project_ids=granted,
    )


async def create_admin_user(
    ctx: Context,
    *,
    username: str,
    password: str | None,
    actor: str,
    role: str = Role.OWNER,
    project_ids: Iterable[str] = (),
) -> AdminUser:
    """Create a panel login; the password is stored only as an argon2id hash, and None means single sign-on."""
    user = new_admin_user(ctx, username=username, password=password, role=role, project_ids=project_ids)
    grant = _grant(Role(user.role), user.project_ids)
    async with ctx.change(actor=actor, action="admin_user.create", detail=grant) as repo:
        if await repo.find_admin_user(user.username) is not None:
            raise Conflict(f"user {user.username} already exists")
        await _require_projects(repo, user.project_ids)
        repo.add(user)
    return user


async def set_admin_role(
    ctx: Context, *, username: str, role: str, project_ids: Iterable[str] = (), actor: str
) -> AdminUser:
    """Give a panel user another role (and projects); its open sessions act under it from their next page."""
    checked, granted = checked_grant(role, project_ids)
    grant = _grant(checked, granted, username=username)
    async with ctx.change(actor=actor, action="admin_user.set_role", detail=grant) as repo:
        user = await _find_user(repo, username)
        await _require_projects(repo, granted)
        if checked != Role.OWNER:
            await _keep_an_owner(repo, user, f"user {user.username}")
        user.role, user.project_ids = checked.value, granted
    return user


async def list_admin_users(ctx: Context) -> Sequence[AdminUser]:
    """Every panel user, by name. Rows: what a caller shows of one is `has_password`, never its hash."""
    async with ctx.database.transaction(write=False) as repo:
        return await repo.list_admin_users()


async def get_admin_user(ctx: Context, *, user_id: str) -> AdminUser:
    """The panel user with this id (the panel's pages name users by id), or NotFound."""
    async with ctx.database.transaction(write=False) as repo:
        user = await repo.get_admin_user(user_id) if plausible_id(user_id) else None
    if user is None:
        raise NotFound("no such user")
    return user


async def delete_admin_user(ctx: Context, *, username: str, actor: str) -> None:
    """Delete a panel user: its sessions end with it, at once. Conflict if it is the last owner."""
    async with ctx.change(actor=actor, action="admin_user.delete", detail={"username": username}) as repo:
        user = await _find_user(repo, username)
        await _keep_an_owner(repo, user, f"user {user.username}")
        await repo.delete_admin_sessions_of(user.id)
        await repo.delete(user)


async def end_admin_sessions(ctx: Context, *, username: str, actor: str) -> int:
    """End every panel session of a user at once (a lost laptop, a shared screen): the next page of each asks it
    to sign in again. Returns how many there were."""
    async with ctx.change(actor=actor, action="admin_user.end_sessions", detail={"username": username}) as repo:
        user = await _find_user(repo, username)
        return await repo.delete_admin_sessions_of(user.id)


async def list_admin_tokens(ctx: Context) -> Sequence[AdminToken]:
    """Every admin token, oldest first. Rows: what a caller shows of one is its `prefix`, never its hash."""
    async with ctx.database.transaction(write=False) as repo:
        return await repo.list_admin_tokens()


async def get_admin_token(ctx: Context, *, token_id: str) -> AdminToken:
    async with ctx.database.transaction(write=False) as repo:
        return await _find_token(repo, token_id)


async def set_admin_token_role(
    ctx: Context, *, token_id: str, role: str, project_ids: Iterable[str] = (), actor: str
) -> AdminToken:
    """Give an admin token another role (and projects), from its next request on."""
    checked, granted = checked_grant(role, project_ids)
    grant = _grant(checked, granted, token_id=token_id)
    async with ctx.change(actor=actor, action="admin_token.set_role", detail=grant) as repo:
        token = await _find_token(repo, token_id)
        await _require_projects(repo, granted)
        if checked != Role.OWNER:
            await _keep_an_owner(repo, token, f"admin token {token.name}")
        token.role, token.project_ids = checked.value, granted
    return token


async def revoke_admin_token(ctx: Context, *, token_id: str, actor: str) -> None:
    """Delete an admin token: its next request is refused (401). Conflict if it is the last owner."""
    async with ctx.change(actor=actor, action="admin_token.revoke", detail={"token_id": token_id}) as repo:
        token = await _find_token(repo, token_id)
        await _keep_an_owner(repo, token, f"admin token {token.name}")
        await repo.delete(token)


async def _find_user(repo: Repository, username: str) -> AdminUser:
    try:
        within("username", Name, username)
    except InvalidInput:  # a name no user can have (a NUL, say) is looked up nowhere, nor repeated
        raise NotFound("no such user") from None
    user = await repo.find_admin_user(username)
    if user is None:
        raise NotFound(f"no user {username}")
    return user


async def _find_token(repo: Repository, token_id: str) -> AdminToken:
    token = await repo.get_admin_token(token_id) if plausible_id(token_id) else None
    if token is None:
        raise NotFound("no such admin token")
    return token


async def _keep_an_owner(repo: Repository, losing: AdminUser | AdminToken, what: str) -> None:
    """Conflict if `losing`, about to stop being an owner, is the last one (users and tokens counted together):
    the gateway always keeps an admin who may manage the others."""
    if losing.role != Role.OWNER:
        return
    if not [owner for owner in await repo.lock_owner_ids() if owner != losing.id]:
        raise Conflict(f"{what} is the last owner: make another user or admin token an owner first")


async def single_sign_on_user(
    ctx: Context,
    *,
    issuer: str,
    subject: str,
    email: str,
    new_users: str,
    new_user_domains: frozenset[str] = frozenset(),
) -> AdminUser:
    """The panel user that the identity provider's account `subject` (whose verified address is `email`) is.

    Known by its subject after its first sign-in, so a reassigned address never reaches another person's user.
    At the first sign-in it takes over the user named `email` (in lower case) only if that user was added for
    single sign-on (no password, no subject yet): a password user is never taken over. Without such a user,
    `new_users` ("viewer") creates one for an address in `new_user_domains`, or ("refused") the sign-in is
    refused until an owner adds it.
    """
    oidc_subject, email = f"{issuer} {subject}", email.lower()
    async with ctx.database.transaction(write=False) as repo:
        user = await repo.find_oidc_user(oidc_subject)
    if user is not None:
        return user
    try:
        async with ctx.change(
            actor=f"sso:{email}", action="admin_user.single_sign_on", detail={"username": email}
        ) as repo:
            user = await repo.find_admin_user(email)
            if user is None:
                if new_users != Role.VIEWER or email.rpartition("@")[2] not in new_user_domains:
                    raise Unauthorized(
                        f"this panel has no user {email}: an owner can add one with "
                        f"`credgate admin create-user {email} --single-sign-on --role viewer`"
                    )
                user = new_admin_user(ctx, username=email, password=None, role=Role.VIEWER)
                repo.add(user)
            elif user.oidc_subject == oidc_subject:
                return user  # the same person's first sign-in, finished a moment ago in another tab
            elif user.has_password or user.oidc_subject is not None:
                raise Unauthorized(f"the panel's user {email} signs in another way, not through single sign-on")
            user.oidc_subject = oidc_subject
    except DuplicateRow:  # the same person's first sign-in, made at the same moment elsewhere
        async with ctx.database.transaction(write=False) as repo:
            user = await repo.find_oidc_user(oidc_subject)
        if user is None:
            raise
    return user
