"""`credgate projects`: projects, their settings, tokens, request log and usage."""

from datetime import timedelta
from types import EllipsisType

import click
from pydantic import ValidationError

from credgate.admin_api.schemas import ProjectOut, ProjectSecretOut, RequestRecordOut, UsageOut
from credgate.cli.base import actor, fail, limited, main, pass_settings, print_json, run
from credgate.config import Settings
from credgate.error_responses import validation_message
from credgate.limits import (
    ConcurrentRequests,
    ExpiresInSeconds,
    GraceSeconds,
    KeyMaxAgeDays,
    ListLimit,
    RateLimitPerMinute,
    UsageDays,
)
from credgate.services import projects, usage
from credgate.services.context import Context
from credgate.specs import IdentityProviderSpec


@main.group("projects")
def projects_group() -> None:
    """Projects and their tokens."""


@projects_group.command("list")
@pass_settings
def projects_list(settings: Settings) -> None:
    print_json([ProjectOut.of(project) for project in run(settings, projects.list_projects)])


@projects_group.command("create")
@click.argument("name")
@pass_settings
def projects_create(settings: Settings, name: str) -> None:
    """Create a project; its token is printed only now."""
    project, secret = run(settings, lambda ctx: projects.create_project(ctx, name=name, actor=actor()))
    print_json(ProjectSecretOut(project=ProjectOut.of(project), secret=secret))


@projects_group.command("show")
@click.argument("project_id")
@pass_settings
def projects_show(settings: Settings, project_id: str) -> None:
    print_json(ProjectOut.of(run(settings, lambda ctx: projects.get_project(ctx, project_id=project_id))))


@projects_group.command("update")
@click.argument("project_id")
@click.option("--name", help="A new name.")
@click.option("--rate-limit", **limited(RateLimitPerMinute, "Requests per minute through the proxy"))
@click.option("--no-rate-limit", is_flag=True, help="Turn the rate limit off.")
@click.option("--max-concurrent", **limited(ConcurrentRequests, "Requests under way at once through the proxy"))
@click.option("--no-max-concurrent", is_flag=True, help="Remove the cap on requests under way at once.")
@click.option("--key-max-age-days", **limited(KeyMaxAgeDays, "Flag keys whose secret is older (an event too)"))
@click.option("--no-key-max-age", is_flag=True, help="Remove the key age policy.")
@click.option(
    "--allowed-origin", "allowed_origins", multiple=True, help="A web origin whose pages may call the proxy (repeat)."
)
@click.option("--no-allowed-origins", is_flag=True, help="No page may call the proxy (CORS off).")
@click.option("--subject-rate-limit", **limited(RateLimitPerMinute, "Each end user's requests per minute"))
@click.option("--no-subject-rate-limit", is_flag=True, help="Turn the per-end-user rate limit off.")
@click.option("--identity-jwks-url", help="Trust end-user JWTs signed by the keys published here …")
@click.option("--identity-issuer", help="… whose `iss` is this …")
@click.option("--identity-audience", help="… and whose `aud` names this.")
@click.option("--no-identity-provider", is_flag=True, help="Trust no identity provider.")
@pass_settings
def projects_update(
    settings: Settings,
    project_id: str,
    name: str | None,
    rate_limit: int | None,
    no_rate_limit: bool,
    max_concurrent: int | None,
    no_max_concurrent: bool,
    key_max_age_days: int | None,
    no_key_max_age: bool,
    allowed_origins: tuple[str, ...],
    no_allowed_origins: bool,
    subject_rate_limit: int | None,
    no_subject_rate_limit: bool,
    identity_jwks_url: str | None,
    identity_issuer: str | None,
    identity_audience: str | None,
    no_identity_provider: bool,
) -> None:
    """Rename a project, set its rate limits, key age policy, allowed origins or identity provider."""
    if allowed_origins and no_allowed_origins:
        fail("--allowed-origin and --no-allowed-origins exclude each other", 2)
    changes = projects.ProjectChanges(
        name=name,
        rate_limit_per_minute=_set_or_clear("rate-limit", rate_limit, no_rate_limit),
        max_concurrent_requests=_set_or_clear("max-concurrent", max_concurrent, no_max_concurrent),
        key_max_age_days=_set_or_clear("key-max-age-days", key_max_age_days, no_key_max_age),
        allowed_origins=[] if no_allowed_origins else (list(allowed_origins) or None),
        subject_rate_limit_per_minute=_set_or_clear("subject-rate-limit", subject_rate_limit, no_subject_rate_limit),
        identity_provider=_identity_provider(
            identity_jwks_url, identity_issuer, identity_audience, clear=no_identity_provider
        ),
    )
    project = run(
        settings, lambda ctx: projects.update_project(ctx, project_id=project_id, changes=changes, actor=actor())
    )
    print_json(ProjectOut.of(project))


def _identity_provider(
    jwks_url: str | None, issuer: str | None, audience: str | None, *, clear: bool
) -> IdentityProviderSpec | EllipsisType | None:
    given = (jwks_url, issuer, audience)
    if clear:
        if any(given):
            fail("--no-identity-provider excludes the --identity- options", 2)
        return None
    if not any(given):
        return ...
    if not all(given):
        fail("--identity-jwks-url, --identity-issuer and --identity-audience go together", 2)
    try:
        return IdentityProviderSpec(jwks_url=jwks_url, issuer=issuer, audience=audience)
    except ValidationError as error:
        fail(validation_message(error.errors(include_input=False)), 2)
        raise


def _set_or_clear(option: str, value: int | None, clear: bool) -> int | EllipsisType | None:
    """A setting with a --no- option: its value, None to clear it, or ... to leave it."""
    if value is not None and clear:
        fail(f"--{option} and its --no- option exclude each other", 2)
    return None if clear else (value if value is not None else ...)


@projects_group.command("requests")
@click.argument("project_id")
@click.option("--limit", default=50, show_default=True, **limited(ListLimit, "How many, newest first"))
@pass_settings
def projects_requests(settings: Settings, project_id: str, limit: int) -> None:
    """The project's recent proxied requests, newest first."""
    records = run(settings, lambda ctx: usage.list_request_records(ctx, project_id=project_id, limit=limit))
    print_json([RequestRecordOut.of(record) for record in records])


@projects_group.command("usage")
@click.argument("project_id")
@click.option("--group-by", type=click.Choice(["provider", "day", "subject"]))
@click.option("--days", default=30, show_default=True, **limited(UsageDays, "How far back, in days"))
@pass_settings
def projects_usage(settings: Settings, project_id: str, group_by: str | None, days: int) -> None:
    """Totals of requests, errors and tokens."""

    async def work(ctx: Context) -> UsageOut:
        until = ctx.clock()
        since, until, rows = await usage.summarize_usage(
            ctx, project_id=project_id, since=until - timedelta(days=days), until=until, group_by=group_by
        )
        return UsageOut.of(since, until, group_by, rows)

    print_json(run(settings, work))


@projects_group.command("delete")
@click.argument("project_id")
@pass_settings
def projects_delete(settings: Settings, project_id: str) -> None:
    """Delete a project: its tokens stop working and its secrets are destroyed."""
    run(settings, lambda ctx: projects.delete_project(ctx, project_id=project_id, actor=actor()))
    click.echo(f"project {project_id} deleted")


@projects_group.command("rotate-token")
@click.argument("project_id")
@click.option(
    "--grace-seconds", default=0, show_default=True, **limited(GraceSeconds, "How long the previous token works")
)
@click.option("--expires-in-seconds", default=None, **limited(ExpiresInSeconds, "The new token's lifetime"))
@pass_settings
def projects_rotate_token(
    settings: Settings, project_id: str, grace_seconds: int, expires_in_seconds: int | None
) -> None:
    """Issue a new project token (printed only now); the old one works for the grace period."""
    project, secret = run(
        settings,
        lambda ctx: projects.rotate_project_token(
            ctx,
            project_id=project_id,
            grace_seconds=grace_seconds,
            expires_in_seconds=expires_in_seconds,
            actor=actor(),
        ),
    )
    print_json(ProjectSecretOut(project=ProjectOut.of(project), secret=secret))


@projects_group.command("revoke-token")
@click.argument("project_id")
@pass_settings
def projects_revoke_token(settings: Settings, project_id: str) -> None:
    """Revoke every token of the project until the next rotation."""
    run(settings, lambda ctx: projects.revoke_project_tokens(ctx, project_id=project_id, actor=actor()))
    click.echo(f"tokens of project {project_id} revoked")
