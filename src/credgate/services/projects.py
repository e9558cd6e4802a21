"""Projects: the unit of isolation; each owns a project token and its integrations."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import EllipsisType

from credgate.crypto import generate_token, hash_token
from credgate.errors import Conflict, InvalidInput, NotFound
from credgate.limits import (
    MAX_ALLOWED_ORIGINS,
    ConcurrentRequests,
    ExpiresInSeconds,
    GraceSeconds,
    KeyMaxAgeDays,
    Name,
    RateLimitPerMinute,
    within,
)
from credgate.netguard import UpstreamRefused, check_upstream_url
from credgate.services.context import Context, new_id, plausible_id
from credgate.specs import IdentityProviderSpec, Origin
from credgate.storage import Repository
from credgate.storage.models import Project, ProjectToken

PROJECT_TOKEN_PREFIX = "cgp_"  # noqa: S105 - a public prefix, not a secret
_DISPLAYED_TOKEN_CHARS = 8  # the prefix plus four random characters: enough to tell tokens apart


async def require_project(repo: Repository, project_id: str) -> Project:
    if not plausible_id(project_id):
        raise NotFound("no such project")  # not quoted: it could be anything, a key pasted in the wrong place
    project = await repo.get_project(project_id)
    if project is None:
        raise NotFound(f"project {project_id} not found")
    return project


def _issue_token(ctx: Context, project: Project, *, expires_in_seconds: int | None) -> str:
    secret = generate_token(PROJECT_TOKEN_PREFIX)
    now = ctx.clock()
    project.tokens.append(
        ProjectToken(
            id=new_id("tok"),
            token_hash=hash_token(secret),
            prefix=secret[:_DISPLAYED_TOKEN_CHARS],
            created_at=now,
            expires_at=None if expires_in_seconds is None else now + timedelta(seconds=expires_in_seconds),
        )
    )
    return secret


def current_token(project: Project) -> ProjectToken | None:
    """The project's newest token, which the API shows (older ones may still be in their grace period)."""
    return max(project.tokens, key=lambda token: token.created_at, default=None)


async def create_project(ctx: Context, *, name: str, actor: str) -> tuple[Project, str]:
    """Create a project and its first token; the token's value is returned only here."""
    name = within("name", Name, name)
    now = ctx.clock()
    project = Project(
        id=new_id("prj"), name=name, created_at=now, updated_at=now, tokens=[], integrations=[], budgets=[]
    )
    async with ctx.change(actor=actor, action="project.create", project_id=project.id) as repo:
        secret = _issue_token(ctx, project, expires_in_seconds=None)
        repo.add(project)
    return project, secret


async def list_projects(ctx: Context) -> Sequence[Project]:
    async with ctx.database.transaction(write=False) as repo:
        return await repo.list_projects()


async def get_project(ctx: Context, *, project_id: str) -> Project:
    async with ctx.database.transaction(write=False) as repo:
        return await require_project(repo, project_id)


@dataclass(frozen=True, slots=True)
class ProjectChanges:
    """A partial update: None leaves `name` as it is; `...` leaves the rate limit, None turns it off."""

    name: str | None = None
    rate_limit_per_minute: int | EllipsisType | None = ...
    max_concurrent_requests: int | EllipsisType | None = ...  # None turns the cap off
    key_max_age_days: int | EllipsisType | None = ...  # keys older than this are flagged; None: no policy
    allowed_origins: Sequence[str] | None = None  # replaces the list; None leaves it
    subject_rate_limit_per_minute: int | EllipsisType | None = ...  # each end user's; None turns it off
    identity_provider: IdentityProviderSpec | EllipsisType | None = ...  # None: trust none


async def update_project(ctx: Context, *, project_id: str, changes: ProjectChanges, actor: str) -> Project:
    if changes.name is not None:
        within("name", Name, changes.name)
    if changes.rate_limit_per_minute is not None and not isinstance(changes.rate_limit_per_minute, EllipsisType):
        within("rate_limit_per_minute", RateLimitPerMinute, changes.rate_limit_per_minute)
    concurrent = changes.max_concurrent_requests
    if concurrent is not None and not isinstance(concurrent, EllipsisType):
        within("max_concurrent_requests", ConcurrentRequests, concurrent)
    if changes.key_max_age_days is not None and not isinstance(changes.key_max_age_days, EllipsisType):
        within("key_max_age_days", KeyMaxAgeDays, changes.key_max_age_days)
    subject_limit = changes.subject_rate_limit_per_minute
    if subject_limit is not None and not isinstance(subject_limit, EllipsisType):
        within("subject_rate_limit_per_minute", RateLimitPerMinute, subject_limit)
    origins = None if changes.allowed_origins is None else _origins(changes.allowed_origins)
    trusted = changes.identity_provider
    if isinstance(trusted, IdentityProviderSpec):
        try:  # its keys are fetched like an upstream's answers: through the same guard, over https
            await check_upstream_url(trusted.jwks_url, allow_private=ctx.allow_private_upstreams)
        except UpstreamRefused as error:
            raise InvalidInput("identity_provider.jwks_url", str(error)) from None
    async with ctx.change(actor=actor, action="project.update", project_id=project_id) as repo:
        project = await require_project(repo, project_id)
        if origins is not None:
            project.allowed_origins = origins
        if not isinstance(subject_limit, EllipsisType):
            project.subject_rate_limit_per_minute = subject_limit
        if isinstance(trusted, IdentityProviderSpec):
            await _check_identity_unclaimed(repo, trusted, project_id)
            project.identity_provider = trusted.model_dump()
        elif trusted is None:
            project.identity_provider = None
        if changes.name is not None:
            project.name = changes.name
        if not isinstance(changes.rate_limit_per_minute, EllipsisType):
            project.rate_limit_per_minute = changes.rate_limit_per_minute
        if not isinstance(concurrent, EllipsisType):
            project.max_concurrent_requests = concurrent
        if not isinstance(changes.key_max_age_days, EllipsisType):
            project.key_max_age_days = changes.key_max_age_days
        project.updated_at = ctx.clock()
    return project


def _origins(origins: Sequence[str]) -> list[str]:
    """Normalised as browsers send them, duplicates dropped, in the order given."""
    if len(origins) > MAX_ALLOWED_ORIGINS:
        raise InvalidInput("allowed_origins", f"must be a list of at most {MAX_ALLOWED_ORIGINS} origins")
    normalised = (within(f"allowed_origins.{index}", Origin, origin) for index, origin in enumerate(origins))
    return list(dict.fromkeys(normalised))


async def _check_identity_unclaimed(repo: Repository, trusted: IdentityProviderSpec, project_id: str) -> None:
    # An identity token names no project: its issuer and audience find it, so they may find only one.
    await repo.lock_identity_claims()
    for other_id, _, other in await repo.project_directory():
        if (
            other
            and other_id != project_id
            and (other["issuer"], other["audience"]) == (trusted.issuer, trusted.audience)
        ):
            raise Conflict(f"project {other_id} already trusts this issuer for this audience")


async def delete_project(ctx: Context, *, project_id: str, actor: str) -> None:
    """Delete a project: its tokens stop working and its secrets are destroyed at once."""
    async with ctx.change(actor=actor, action="project.delete", project_id=project_id) as repo:
        await repo.delete(await require_project(repo, project_id))


async def rotate_project_token(
    ctx: Context, *, project_id: str, actor: str, grace_seconds: int = 0, expires_in_seconds: int | None = None
) -> tuple[Project, str]:
    """Issue a new token; earlier ones keep working for `grace_seconds` at most, then stop."""
    within("grace_seconds", GraceSeconds, grace_seconds)
    if expires_in_seconds is not None:
        within("expires_in_seconds", ExpiresInSeconds, expires_in_seconds)
    async with ctx.change(actor=actor, action="project_token.rotate", project_id=project_id) as repo:
        project = await require_project(repo, project_id)
        now = ctx.clock()
        if grace_seconds == 0:
            await repo.delete_project_tokens(project_id)
        else:
            await repo.delete_project_tokens(project_id, expired_before=now)
            await repo.cap_project_token_expiry(project_id, expires_at=now + timedelta(seconds=grace_seconds))
        await repo.refresh(project, ["tokens"])
        secret = _issue_token(ctx, project, expires_in_seconds=expires_in_seconds)
        project.updated_at = now
    return project, secret


async def revoke_project_tokens(ctx: Context, *, project_id: str, actor: str) -> None:
    """Revoke every token of the project; none works until the next rotation."""
    async with ctx.change(actor=actor, action="project_token.revoke", project_id=project_id) as repo:
        await require_project(repo, project_id)
        await repo.delete_project_tokens(project_id)
