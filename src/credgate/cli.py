"""The `credgate` command: thin commands over the services; `serve` runs the gateway.

Output is the admin API's JSON, so scripts see one shape everywhere. Secrets are read from standard input,
never from arguments (which other users can see in the process list). Exit codes: 0 ok, 1 unexpected,
2 usage or invalid input, 3 not found, 4 conflict, 5 configuration or storage problem.
"""

import asyncio
import getpass
import json
import logging
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import EllipsisType
from typing import Any, BinaryIO, TypeVar

import click
from pydantic import BaseModel, TypeAdapter, ValidationError

from credgate.admin_api.schemas import (
    AuditEventOut,
    BudgetOut,
    DeliveryOut,
    IntegrationIn,
    IntegrationOut,
    IntegrationPatchIn,
    PoolKeyOut,
    ProjectOut,
    ProjectSecretOut,
    RequestRecordOut,
    TemplateOut,
    UsageOut,
    VerificationOut,
    WebhookOut,
    WebhookSecretOut,
)
from credgate.audit_chain import GENESIS, ChainBroken, verify_lines
from credgate.catalog import Template
from credgate.config import MAX_WORKERS, Settings
from credgate.crypto import encode_master_key, new_master_key
from credgate.error_responses import validation_message
from credgate.errors import Conflict, InvalidInput, NotFound, ServiceError, StartupError
from credgate.limits import (
    MAX_KEY_LABEL_LENGTH,
    MAX_KEYS_PER_INTEGRATION,
    ConcurrentRequests,
    ExpiresInSeconds,
    GraceSeconds,
    KeyMaxAgeDays,
    ListLimit,
    RateLimitPerMinute,
    StreamIdleTimeoutSeconds,
    TimeoutSeconds,
    TotalTimeoutSeconds,
    UsageDays,
    describe,
    parse_float,
    parse_int,
)
from credgate.roles import ROLES, Role
from credgate.services import (
    admins,
    audit,
    budgets,
    events,
    integrations,
    key_pools,
    master_keys,
    panel_sessions,
    projects,
    usage,
    verification,
)
from credgate.services.bootstrap import open_context
from credgate.services.context import Context
from credgate.services.verification import Verification
from credgate.specs import AuthSpec, Endpoint, IdentityProviderSpec
from credgate.spending import METRICS, PERIODS
from credgate.storage.models import Integration

T = TypeVar("T")
EXIT_CODES: dict[type[Exception], int] = {InvalidInput: 2, NotFound: 3, Conflict: 4, StartupError: 5}
_auth_adapter: TypeAdapter[AuthSpec] = TypeAdapter(AuthSpec)


def _actor() -> str:
    return f"cli:{getpass.getuser()}"


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _run(settings: Settings, work: Callable[[Context], Awaitable[T]]) -> T:
    """Open the gateway's state, run one piece of work, close; errors become a message and an exit code."""

    async def main() -> T:
        ctx = await open_context(settings)
        try:
            return await work(ctx)
        finally:
            await ctx.close()

    try:
        return asyncio.run(main())
    except (ServiceError, StartupError) as error:
        _fail(str(error), next((code for kind, code in EXIT_CODES.items() if isinstance(error, kind)), 1))
    raise AssertionError("unreachable")


def _print(value: BaseModel | Sequence[BaseModel] | dict[str, Any]) -> None:
    if isinstance(value, list | tuple):
        value = {"items": [item.model_dump(mode="json") for item in value]}
    elif isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def _read_secret(label: str) -> str:
    """A secret from standard input: typed without echo at a terminal, else the piped text."""
    if sys.stdin.isatty():
        return str(click.prompt(label, hide_input=True))
    value = sys.stdin.read().strip()
    if not value:
        _fail(f"{label} was empty on standard input", 2)
    return value


class Limited(click.ParamType):  # type: ignore[type-arg]  # generic in recent click only; >=8.1 is allowed
    """A number within one of the domain's limits; otherwise a usage error (exit 2) naming the option."""

    def __init__(self, kind: object, *, whole: bool) -> None:
        self.kind = kind
        self.whole = whole
        self.name = "integer" if whole else "number"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | float:
        read = parse_int if self.whole else parse_float
        try:
            return read("value", self.kind, str(value))
        except InvalidInput as error:
            self.fail(error.problem, param, ctx)


def _limited(kind: object, help_text: str, *, whole: bool = True) -> dict[str, Any]:
    """The option arguments for a number within `kind`, its range in the help."""
    return {"type": Limited(kind, whole=whole), "help": f"{help_text} ({describe(kind)})."}


pass_settings = click.make_pass_decorator(Settings)


@click.group()
@click.version_option(package_name="credgate")
@click.pass_context
def main(click_ctx: click.Context) -> None:
    """credgate: a secure API gateway. Configuration: CREDGATE_* environment variables (see the README)."""
    try:
        click_ctx.obj = Settings()
    except ValidationError as error:
        _fail(f"invalid configuration: {validation_message(list(error.errors()))}", 5)


@main.command()
@click.option("--host", help="Listen address [CREDGATE_HOST, default 127.0.0.1].")
@click.option("--port", type=int, help="Listen port [CREDGATE_PORT, default 8080].")
@click.option(
    "--workers",
    type=click.IntRange(1, MAX_WORKERS),
    help=f"Processes sharing the listening socket, 1 to {MAX_WORKERS}: about one per core "
    "[CREDGATE_WORKERS, default 1].",
)
@pass_settings
def serve(settings: Settings, host: str | None, port: int | None, workers: int | None) -> None:
    """Run the gateway: proxy, admin API and panel, in one process or in --workers processes."""
    # The server's parts (uvicorn, the proxy, its HTTP client) are loaded for this command only: every other
    # command, a script's or a test's, starts without them.
    import uvicorn

    from credgate.app import create_app
    from credgate.server import bind_listeners, configure_logging, exit_zero_on_sigterm, run_workers, server_config
    from credgate.tracing import tracing_requested

    settings = settings.model_copy(
        update={"host": host or settings.host, "port": port or settings.port, "workers": workers or settings.workers}
    )
    configure_logging(settings)

    async def run_server() -> None:
        listeners = bind_listeners(settings)
        try:
            ctx = await _open_and_announce(settings)
            server = uvicorn.Server(server_config(create_app(settings, context=ctx), settings))
            exit_zero_on_sigterm()
            try:
                await server.serve(sockets=listeners)
            finally:
                await ctx.close()
        finally:
            for listener in listeners:
                listener.close()

    async def prepare_workers() -> str:
        """Migrations, the identity check and first-run setup happen here, once, before any worker starts."""
        ctx = await _open_and_announce(settings)
        await ctx.close()
        if ctx.database.database_id is None:
            raise AssertionError("unreachable: open_context settles the database's id")
        return ctx.database.database_id

    try:
        tracing_requested()  # the OTEL_* variables checked before anything starts (each worker opens its tracing)
        if settings.workers == 1:
            _run_loop(run_server())
        else:
            run_workers(settings, create_app, database_id=asyncio.run(prepare_workers()))
    except StartupError as error:
        _fail(str(error), 5)


async def _open_and_announce(settings: Settings) -> Context:
    """Open (and migrate) the gateway's state, then tell the operator where it serves: once, whatever the workers."""
    ctx = await open_context(settings)
    try:
        base = f"http://{settings.host}:{settings.port}"
        admin_listener = settings.admin_listener
        admin_base = base if admin_listener is None else f"http://{admin_listener[0]}:{admin_listener[1]}"
        click.echo(f"credgate is serving at {base}")
        click.echo(f"  proxy:     {base}/proxy/<provider>/<endpoint>")
        click.echo(f"  panel:     {admin_base}/admin")
        click.echo(f"  admin API: {admin_base}/api/v1 (create an admin token with: credgate admin create-token)")
        if admin_listener is not None:
            click.echo(f"  metrics:   {admin_base}/metrics (the admin listener only)")
        if settings.workers > 1:
            click.echo(f"  workers:   {settings.workers} processes")
        if settings.allow_private_upstreams:
            # A security-relevant mode must be impossible to miss: on the terminal and in the log.
            warning = (
                "CREDGATE_ALLOW_PRIVATE_UPSTREAMS is on: the SSRF guard is off, and integrations may reach "
                "loopback, private and cloud-metadata addresses over plain http"
            )
            click.echo(f"\nWARNING: {warning}", err=True)
            logging.getLogger("credgate").warning(warning)
        setup_token = await panel_sessions.issue_setup_token(ctx)
        if setup_token is not None:
            # Deliberately on the operator's terminal only (never logged): it works once, until an admin exists.
            setup_link = f"{admin_base}/admin/setup?token={setup_token}"
            click.echo(f"\nNo admin exists yet. Create the first one, once, at:\n  {setup_link}\n")
    except BaseException:
        await ctx.close()
        raise
    return ctx


def _run_loop(coroutine: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # an optional speed-up, absent on Windows
        asyncio.run(coroutine)
    else:
        uvloop.run(coroutine)


@main.group()
def db() -> None:
    """The database."""


@db.command("upgrade")
@pass_settings
def db_upgrade(settings: Settings) -> None:
    """Create or migrate the schema (also done at every start)."""

    async def work(_ctx: Context) -> None:
        return None

    _run(settings, work)
    click.echo("database is up to date")


@main.group("master-key")
def master_key() -> None:
    """The master key that seals every stored secret."""


@master_key.command("rotate")
@pass_settings
def master_key_rotate(settings: Settings) -> None:
    """Re-encrypt every secret under a new master key while the gateway keeps serving.

    With the key file, a new key is generated. With CREDGATE_MASTER_KEY, put the new key first (the old ones
    after, comma-separated), run this, then drop the old keys from the variable.
    """

    async def work(ctx: Context) -> int:
        return await master_keys.rotate_master_key(ctx, settings, actor=_actor())

    resealed = _run(settings, work)
    click.echo(f"master key rotated: {resealed} secrets re-encrypted")


@master_key.command("generate")
def master_key_generate() -> None:
    """Print a new random master key (for CREDGATE_MASTER_KEY)."""
    click.echo(encode_master_key(new_master_key()))


@main.group()
def admin() -> None:
    """Admin tokens and panel users."""


_role_option = click.option(
    "--role",
    type=click.Choice(ROLES),
    default=Role.OWNER.value,
    show_default=True,
    help="owner: everything; project_admin: the --project ones; viewer: read-only (of the --project ones if given).",
)
_project_option = click.option(
    "--project", "project_ids", multiple=True, metavar="ID", help="A project granted (repeat for more)."
)


@admin.command("create-token")
@click.option("--name", default="admin", show_default=True, help="A label for the audit log.")
@_role_option
@_project_option
@pass_settings
def admin_create_token(settings: Settings, name: str, role: str, project_ids: tuple[str, ...]) -> None:
    """Print a new admin API token with its role (shown only now)."""
    click.echo(
        _run(
            settings,
            lambda ctx: admins.create_admin_token(ctx, name=name, actor=_actor(), role=role, project_ids=project_ids),
        )
    )


@admin.command("create-user")
@click.argument("username")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.option(
    "--single-sign-on", is_flag=True, help="No password: the user signs in through the identity provider as USERNAME."
)
@_role_option
@_project_option
@pass_settings
def admin_create_user(
    settings: Settings,
    username: str,
    password_stdin: bool,
    single_sign_on: bool,
    role: str,
    project_ids: tuple[str, ...],
) -> None:
    """Create a panel login with its role: a password, or single sign-on by the user's verified email address."""
    if password_stdin == single_sign_on:
        raise click.UsageError("give one of --password-stdin and --single-sign-on")
    password = _read_secret("password") if password_stdin else None
    _run(
        settings,
        lambda ctx: admins.create_admin_user(
            ctx, username=username, password=password, actor=_actor(), role=role, project_ids=project_ids
        ),
    )
    click.echo(f"user {username} created")


@admin.command("set-role")
@click.argument("username")
@click.option("--role", type=click.Choice(ROLES), required=True, help="owner, project_admin or viewer.")
@_project_option
@pass_settings
def admin_set_role(settings: Settings, username: str, role: str, project_ids: tuple[str, ...]) -> None:
    """Give a panel user another role (and its projects); it applies from the user's next page."""
    _run(
        settings,
        lambda ctx: admins.set_admin_role(ctx, username=username, role=role, project_ids=project_ids, actor=_actor()),
    )
    click.echo(f"user {username} is now {role}")


@admin.command("end-sessions")
@click.argument("username")
@pass_settings
def admin_end_sessions(settings: Settings, username: str) -> None:
    """End every panel session of a user at once; it signs in again at its next page."""
    ended = _run(settings, lambda ctx: admins.end_admin_sessions(ctx, username=username, actor=_actor()))
    click.echo(f"ended {ended} session{'' if ended == 1 else 's'} of user {username}")


@main.group("projects")
def projects_group() -> None:
    """Projects and their tokens."""


@projects_group.command("list")
@pass_settings
def projects_list(settings: Settings) -> None:
    _print([ProjectOut.of(project) for project in _run(settings, projects.list_projects)])


@projects_group.command("create")
@click.argument("name")
@pass_settings
def projects_create(settings: Settings, name: str) -> None:
    """Create a project; its token is printed only now."""
    project, secret = _run(settings, lambda ctx: projects.create_project(ctx, name=name, actor=_actor()))
    _print(ProjectSecretOut(project=ProjectOut.of(project), secret=secret))


@projects_group.command("show")
@click.argument("project_id")
@pass_settings
def projects_show(settings: Settings, project_id: str) -> None:
    _print(ProjectOut.of(_run(settings, lambda ctx: projects.get_project(ctx, project_id=project_id))))


@projects_group.command("update")
@click.argument("project_id")
@click.option("--name", help="A new name.")
@click.option("--rate-limit", **_limited(RateLimitPerMinute, "Requests per minute through the proxy"))
@click.option("--no-rate-limit", is_flag=True, help="Turn the rate limit off.")
@click.option("--max-concurrent", **_limited(ConcurrentRequests, "Requests under way at once through the proxy"))
@click.option("--no-max-concurrent", is_flag=True, help="Remove the cap on requests under way at once.")
@click.option("--key-max-age-days", **_limited(KeyMaxAgeDays, "Flag keys whose secret is older (an event too)"))
@click.option("--no-key-max-age", is_flag=True, help="Remove the key age policy.")
@click.option(
    "--allowed-origin", "allowed_origins", multiple=True, help="A web origin whose pages may call the proxy (repeat)."
)
@click.option("--no-allowed-origins", is_flag=True, help="No page may call the proxy (CORS off).")
@click.option("--subject-rate-limit", **_limited(RateLimitPerMinute, "Each end user's requests per minute"))
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
        _fail("--allowed-origin and --no-allowed-origins exclude each other", 2)
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
    project = _run(
        settings, lambda ctx: projects.update_project(ctx, project_id=project_id, changes=changes, actor=_actor())
    )
    _print(ProjectOut.of(project))


def _identity_provider(
    jwks_url: str | None, issuer: str | None, audience: str | None, *, clear: bool
) -> IdentityProviderSpec | EllipsisType | None:
    given = (jwks_url, issuer, audience)
    if clear:
        if any(given):
            _fail("--no-identity-provider excludes the --identity- options", 2)
        return None
    if not any(given):
        return ...
    if not all(given):
        _fail("--identity-jwks-url, --identity-issuer and --identity-audience go together", 2)
    try:
        return IdentityProviderSpec(jwks_url=jwks_url, issuer=issuer, audience=audience)
    except ValidationError as error:
        _fail(validation_message(error.errors(include_input=False)), 2)
        raise


def _set_or_clear(option: str, value: int | None, clear: bool) -> int | EllipsisType | None:
    """A setting with a --no- option: its value, None to clear it, or ... to leave it."""
    if value is not None and clear:
        _fail(f"--{option} and its --no- option exclude each other", 2)
    return None if clear else (value if value is not None else ...)


@projects_group.command("requests")
@click.argument("project_id")
@click.option("--limit", default=50, show_default=True, **_limited(ListLimit, "How many, newest first"))
@pass_settings
def projects_requests(settings: Settings, project_id: str, limit: int) -> None:
    """The project's recent proxied requests, newest first."""
    records = _run(settings, lambda ctx: usage.list_request_records(ctx, project_id=project_id, limit=limit))
    _print([RequestRecordOut.of(record) for record in records])


@projects_group.command("usage")
@click.argument("project_id")
@click.option("--group-by", type=click.Choice(["provider", "day", "subject"]))
@click.option("--days", default=30, show_default=True, **_limited(UsageDays, "How far back, in days"))
@pass_settings
def projects_usage(settings: Settings, project_id: str, group_by: str | None, days: int) -> None:
    """Totals of requests, errors and tokens."""

    async def work(ctx: Context) -> UsageOut:
        until = ctx.clock()
        since, until, rows = await usage.summarize_usage(
            ctx, project_id=project_id, since=until - timedelta(days=days), until=until, group_by=group_by
        )
        return UsageOut.of(since, until, group_by, rows)

    _print(_run(settings, work))


@projects_group.command("delete")
@click.argument("project_id")
@pass_settings
def projects_delete(settings: Settings, project_id: str) -> None:
    """Delete a project: its tokens stop working and its secrets are destroyed."""
    _run(settings, lambda ctx: projects.delete_project(ctx, project_id=project_id, actor=_actor()))
    click.echo(f"project {project_id} deleted")


@projects_group.command("rotate-token")
@click.argument("project_id")
@click.option(
    "--grace-seconds", default=0, show_default=True, **_limited(GraceSeconds, "How long the previous token works")
)
@click.option("--expires-in-seconds", default=None, **_limited(ExpiresInSeconds, "The new token's lifetime"))
@pass_settings
def projects_rotate_token(
    settings: Settings, project_id: str, grace_seconds: int, expires_in_seconds: int | None
) -> None:
    """Issue a new project token (printed only now); the old one works for the grace period."""
    project, secret = _run(
        settings,
        lambda ctx: projects.rotate_project_token(
            ctx,
            project_id=project_id,
            grace_seconds=grace_seconds,
            expires_in_seconds=expires_in_seconds,
            actor=_actor(),
        ),
    )
    _print(ProjectSecretOut(project=ProjectOut.of(project), secret=secret))


@projects_group.command("revoke-token")
@click.argument("project_id")
@pass_settings
def projects_revoke_token(settings: Settings, project_id: str) -> None:
    """Revoke every token of the project until the next rotation."""
    _run(settings, lambda ctx: projects.revoke_project_tokens(ctx, project_id=project_id, actor=_actor()))
    click.echo(f"tokens of project {project_id} revoked")


@main.group("integrations")
def integrations_group() -> None:
    """A project's provider integrations."""


def _parse_auth(auth: str | None) -> AuthSpec | None:
    if auth is None:
        return None
    try:
        return _auth_adapter.validate_json(auth)
    except ValidationError as error:
        _fail(f"--auth: {validation_message(list(error.errors()))}", 2)
    raise AssertionError("unreachable")


def _parse_pairs(option: str, pairs: tuple[str, ...]) -> dict[str, str] | None:
    if not pairs:
        return None
    parsed = {}
    for pair in pairs:
        name, separator, value = pair.partition("=")
        if not separator or not name:
            _fail(f"{option} takes NAME=VALUE", 2)
        parsed[name] = value
    return parsed


_PRIVATE_NETWORK_HELP = (
    "An exception to the SSRF guard for this integration alone (repeatable): an IP network (10.0.0.0/8), an "
    "address or a host name it may reach although not public, over plain http too; never link-local or metadata."
)


@integrations_group.command("list")
@click.argument("project_id")
@pass_settings
def integrations_list(settings: Settings, project_id: str) -> None:
    found = _run(settings, lambda ctx: integrations.list_integrations(ctx, project_id=project_id))
    _print([IntegrationOut.of(integration) for integration in found])


@integrations_group.command("show")
@click.argument("project_id")
@click.argument("provider")
@pass_settings
def integrations_show(settings: Settings, project_id: str, provider: str) -> None:
    found = _run(settings, lambda ctx: integrations.get_integration(ctx, project_id=project_id, provider=provider))
    _print(IntegrationOut.of(found))


@integrations_group.command("add")
@click.argument("project_id")
@click.argument("provider")
@click.option("--template", help="A template id (see `credgate templates`); omit for a custom integration.")
@click.option("--base-url", help="Required for a custom integration; overrides the template's.")
@click.option("--auth", help='Custom integrations: JSON, e.g. \'{"method": "header", "name": "x-api-key"}\'.')
@click.option("--api-key-stdin", is_flag=True, help="Read the provider API key from standard input.")
@click.option("--private-network", "private_networks", multiple=True, help=_PRIVATE_NETWORK_HELP)
@pass_settings
def integrations_add(
    settings: Settings,
    project_id: str,
    provider: str,
    template: str | None,
    base_url: str | None,
    auth: str | None,
    api_key_stdin: bool,
    private_networks: tuple[str, ...],
) -> None:
    """Set a provider up in a project, from a template or custom."""
    api_key = _read_secret("API key") if api_key_stdin else None
    fields: dict[str, Any] = {"provider": provider, "template": template, "base_url": base_url, "api_key": api_key}
    fields["auth"] = _parse_auth(auth)
    fields["private_networks"] = list(private_networks) or None
    try:
        request = IntegrationIn.model_validate({name: value for name, value in fields.items() if value is not None})
    except ValidationError as error:
        _fail(validation_message(list(error.errors())), 2)

    async def work(ctx: Context) -> Integration:
        integration, _created = await integrations.add_integration(
            ctx,
            project_id=project_id,
            provider=request.provider,
            template_id=request.template,
            api_key=request.api_key.get_secret_value() if request.api_key else None,
            base_url=request.base_url,
            auth=request.auth,
            private_networks=request.private_networks,
            actor=_actor(),
        )
        return integration

    _print(IntegrationOut.of(_run(settings, work)))


@integrations_group.command("update")
@click.argument("project_id")
@click.argument("provider")
@click.option("--base-url")
@click.option("--auth", help="JSON auth method, as for `add`.")
@click.option("--enable/--disable", default=None)
@click.option(
    "--timeout-seconds", **_limited(TimeoutSeconds, "How long to wait for the provider's response headers", whole=False)
)
@click.option(
    "--stream-idle-timeout",
    **_limited(StreamIdleTimeoutSeconds, "Cut off a started response silent for this many seconds", whole=False),
)
@click.option(
    "--total-timeout",
    **_limited(TotalTimeoutSeconds, "End a request still under way after this many seconds", whole=False),
)
@click.option("--header", "headers", multiple=True, help="NAME=VALUE; replaces all default headers.")
@click.option("--query", "query", multiple=True, help="NAME=VALUE; replaces all default query parameters.")
@click.option(
    "--private-network", "private_networks", multiple=True, help=_PRIVATE_NETWORK_HELP + " Replaces the list."
)
@click.option("--no-private-networks", is_flag=True, help="Remove every exception: the full SSRF guard again.")
@pass_settings
def integrations_update(
    settings: Settings,
    project_id: str,
    provider: str,
    base_url: str | None,
    auth: str | None,
    enable: bool | None,
    timeout_seconds: float | None,
    stream_idle_timeout: float | None,
    total_timeout: float | None,
    headers: tuple[str, ...],
    query: tuple[str, ...],
    private_networks: tuple[str, ...],
    no_private_networks: bool,
) -> None:
    """Change an integration's settings."""
    if private_networks and no_private_networks:
        _fail("--private-network and --no-private-networks exclude each other", 2)
    fields = {
        "base_url": base_url,
        "auth": _parse_auth(auth),
        "enabled": enable,
        "timeout_seconds": timeout_seconds,
        "stream_idle_timeout_seconds": stream_idle_timeout,
        "total_timeout_seconds": total_timeout,
        "headers": _parse_pairs("--header", headers),
        "query": _parse_pairs("--query", query),
        "private_networks": [] if no_private_networks else list(private_networks) or None,
    }
    try:
        patch = IntegrationPatchIn.model_validate({name: value for name, value in fields.items() if value is not None})
    except ValidationError as error:
        _fail(validation_message(list(error.errors())), 2)
    changes = integrations.IntegrationChanges(**{name: getattr(patch, name) for name in patch.model_fields_set})
    found = _run(
        settings,
        lambda ctx: integrations.update_integration(
            ctx, project_id=project_id, provider=provider, changes=changes, actor=_actor()
        ),
    )
    _print(IntegrationOut.of(found))


@integrations_group.command("delete")
@click.argument("project_id")
@click.argument("provider")
@pass_settings
def integrations_delete(settings: Settings, project_id: str, provider: str) -> None:
    _run(
        settings,
        lambda ctx: integrations.delete_integration(ctx, project_id=project_id, provider=provider, actor=_actor()),
    )
    click.echo(f"integration {provider} of project {project_id} deleted")


@integrations_group.command("set-endpoints")
@click.argument("project_id")
@click.argument("provider")
@click.argument("endpoints", nargs=-1)
@pass_settings
def integrations_set_endpoints(settings: Settings, project_id: str, provider: str, endpoints: tuple[str, ...]) -> None:
    """Replace the allowed endpoints, each as "METHOD path" (e.g. "POST chat/completions", "* v1/**")."""
    parsed = []
    for entry in endpoints:
        method, _, path = entry.strip().partition(" ")
        try:
            parsed.append(Endpoint.model_validate({"method": method.upper(), "path": path.strip()}))
        except ValidationError as error:
            _fail(f"endpoint {entry!r}: {validation_message(list(error.errors()))}", 2)
    found = _run(
        settings,
        lambda ctx: integrations.set_endpoints(
            ctx, project_id=project_id, provider=provider, endpoints=parsed, actor=_actor()
        ),
    )
    _print(IntegrationOut.of(found))


@main.group("keys")
def keys_group() -> None:
    """Provider API keys: set (edit or rotate) and revoke."""


@keys_group.command("set")
@click.argument("project_id")
@click.argument("provider")
@click.option("--api-key-stdin", is_flag=True, required=True, help="Read the new key from standard input.")
@pass_settings
def keys_set(settings: Settings, project_id: str, provider: str, api_key_stdin: bool) -> None:
    """Edit or rotate a provider key; requests that start afterwards use the new one."""
    api_key = _read_secret("API key")
    found = _run(
        settings,
        lambda ctx: integrations.set_provider_key(
            ctx, project_id=project_id, provider=provider, api_key=api_key, actor=_actor()
        ),
    )
    _print(IntegrationOut.of(found))


@keys_group.command("revoke")
@click.argument("project_id")
@click.argument("provider")
@pass_settings
def keys_revoke(settings: Settings, project_id: str, provider: str) -> None:
    """Revoke a provider key: it is destroyed, and requests get 403 until a new key is set."""
    found = _run(
        settings,
        lambda ctx: integrations.revoke_provider_key(ctx, project_id=project_id, provider=provider, actor=_actor()),
    )
    _print(IntegrationOut.of(found))


@keys_group.command("list")
@click.argument("project_id")
@click.argument("provider")
@pass_settings
def keys_list(settings: Settings, project_id: str, provider: str) -> None:
    """The integration's key pool, in order: ids, labels, hints and states, never a secret."""
    found = _run(settings, lambda ctx: integrations.get_integration(ctx, project_id=project_id, provider=provider))
    _print([PoolKeyOut.of(key) for key in found.keys])


@keys_group.command("add")
@click.argument("project_id")
@click.argument("provider")
@click.option("--api-key-stdin", is_flag=True, required=True, help="Read the key from standard input.")
@click.option("--label", default="", help=f"A name for the key (at most {MAX_KEY_LABEL_LENGTH} characters).")
@pass_settings
def keys_add(settings: Settings, project_id: str, provider: str, api_key_stdin: bool, label: str) -> None:
    """Add a key at the end of the integration's pool, in service at once."""
    api_key = _read_secret("API key")
    _, key = _run(
        settings,
        lambda ctx: key_pools.add_key(
            ctx, project_id=project_id, provider=provider, api_key=api_key, label=label, actor=_actor()
        ),
    )
    _print(PoolKeyOut.of(key))


@keys_group.command("update")
@click.argument("project_id")
@click.argument("provider")
@click.argument("key_id")
@click.option("--label", help="A new name for the key.")
@click.option("--disable/--enable", "disabled", default=None, help="Take it out of service, or put it back.")
@click.option(
    "--position", type=click.IntRange(0, MAX_KEYS_PER_INTEGRATION - 1), help="Its place in the pool, 0 first."
)
@pass_settings
def keys_update(
    settings: Settings,
    project_id: str,
    provider: str,
    key_id: str,
    label: str | None,
    disabled: bool | None,
    position: int | None,
) -> None:
    """Rename, disable or enable (also after the provider refused it), or move a key of the pool."""
    found = _run(
        settings,
        lambda ctx: key_pools.update_key(
            ctx,
            project_id=project_id,
            provider=provider,
            key_id=key_id,
            actor=_actor(),
            label=label,
            disabled=disabled,
            position=position,
        ),
    )
    _print(IntegrationOut.of(found))


@keys_group.command("verify")
@click.argument("project_id")
@click.argument("provider")
@click.argument("key_id")
@pass_settings
def keys_verify(settings: Settings, project_id: str, provider: str, key_id: str) -> None:
    """Ask the provider, with the template's cheap call, whether it accepts a key of the pool (whatever its state:
    a new key can be checked before it is moved first)."""

    from credgate.runtime import Runtime  # the proxy, loaded for this command only

    async def work(ctx: Context) -> Verification:
        runtime = Runtime(settings, open_context, context=ctx)  # the proxy's own guarded, bounded call
        async with runtime.running():
            return await verification.verify_provider_key(
                ctx, runtime.verify_key, project_id=project_id, provider=provider, key_id=key_id
            )

    _print(VerificationOut.of(_run(settings, work)))


@keys_group.command("promote")
@click.argument("project_id")
@click.argument("provider")
@click.argument("key_id")
@click.option(
    "--retire-previous-after",
    "retire_after",
    type=click.IntRange(0, 30 * 86400),
    help="Remove the key that was first after this many seconds of overlap (default: keep it).",
)
@pass_settings
def keys_promote(settings: Settings, project_id: str, provider: str, key_id: str, retire_after: int | None) -> None:
    """Put a key first and in service (verify it first); its predecessor serves as the fallback until retired."""
    found = _run(
        settings,
        lambda ctx: key_pools.promote_key(
            ctx,
            project_id=project_id,
            provider=provider,
            key_id=key_id,
            retire_previous_after_seconds=retire_after,
            actor=_actor(),
        ),
    )
    _print(IntegrationOut.of(found))


@keys_group.command("remove")
@click.argument("project_id")
@click.argument("provider")
@click.argument("key_id")
@pass_settings
def keys_remove(settings: Settings, project_id: str, provider: str, key_id: str) -> None:
    """Remove a key from the pool; its secret goes with it."""
    found = _run(
        settings,
        lambda ctx: key_pools.remove_key(ctx, project_id=project_id, provider=provider, key_id=key_id, actor=_actor()),
    )
    _print(IntegrationOut.of(found))


@integrations_group.command("set-prices")
@click.argument("project_id")
@click.argument("provider")
@click.argument("prices", nargs=-1)
@pass_settings
def integrations_set_prices(settings: Settings, project_id: str, provider: str, prices: tuple[str, ...]) -> None:
    """Replace the price list, each line as "MODEL=INPUT,OUTPUT" in dollars per million tokens (e.g.
    "gpt-4o-mini*=0.15,0.6"); MODEL is a glob and the first matching line prices a response. None clears it."""
    lines = []
    for index, entry in enumerate(prices, 1):
        model, _, numbers = entry.rpartition("=")
        input_price, _, output_price = numbers.partition(",")
        try:
            lines.append({"model": model.strip(), "input": float(input_price), "output": float(output_price)})
        except ValueError:
            _fail(f"price {index}: must be MODEL=INPUT,OUTPUT, two numbers of dollars per million tokens", 2)
    found = _run(
        settings,
        lambda ctx: budgets.set_prices(ctx, project_id=project_id, provider=provider, prices=lines, actor=_actor()),
    )
    _print(IntegrationOut.of(found))


@main.group("budgets")
def budgets_group() -> None:
    """A project's budgets: requests, tokens or cost per UTC day or month; 402 once spent."""


async def _budget_states(ctx: Context, project_id: str, budget_id: str | None = None) -> list[BudgetOut]:
    states = await budgets.list_budgets(ctx, project_id=project_id)
    return [BudgetOut.of(state) for state in states if budget_id in (None, state.budget.id)]


@budgets_group.command("list")
@click.argument("project_id")
@pass_settings
def budgets_list(settings: Settings, project_id: str) -> None:
    """The project's budgets and what each has spent in its current period."""
    _print(_run(settings, lambda ctx: _budget_states(ctx, project_id)))


@budgets_group.command("add")
@click.argument("project_id")
@click.option("--metric", type=click.Choice(METRICS), required=True, help="What the budget counts.")
@click.option("--limit", type=float, required=True, help="Requests or tokens (whole), or dollars for cost.")
@click.option("--period", type=click.Choice(PERIODS), required=True, help="A UTC calendar day or month.")
@click.option("--provider", help="Only this provider's traffic (default: every provider).")
@click.option("--reserve", type=float, help="Tokens or cost budgets: held per request until its usage is known.")
@click.option("--per-subject", is_flag=True, help="The limit holds for each end user (token subject) apart.")
@pass_settings
def budgets_add(
    settings: Settings,
    project_id: str,
    metric: str,
    limit: float,
    period: str,
    provider: str | None,
    reserve: float | None,
    per_subject: bool,
) -> None:
    """Add a budget; requests over it get 402 until the period resets."""

    async def work(ctx: Context) -> list[BudgetOut]:
        budget = await budgets.add_budget(
            ctx,
            project_id=project_id,
            metric=metric,
            limit=limit,
            period=period,
            provider=provider,
            reserve=reserve,
            per_subject=per_subject,
            actor=_actor(),
        )
        return await _budget_states(ctx, project_id, budget.id)

    _print(_run(settings, work)[0])


@budgets_group.command("update")
@click.argument("project_id")
@click.argument("budget_id")
@click.option("--limit", type=float, help="A new limit; the period's spend so far counts against it.")
@click.option("--period", type=click.Choice(PERIODS), help="A new period.")
@pass_settings
def budgets_update(
    settings: Settings, project_id: str, budget_id: str, limit: float | None, period: str | None
) -> None:
    """Change a budget's limit or period."""

    async def work(ctx: Context) -> list[BudgetOut]:
        await budgets.update_budget(
            ctx, project_id=project_id, budget_id=budget_id, limit=limit, period=period, actor=_actor()
        )
        return await _budget_states(ctx, project_id, budget_id)

    _print(_run(settings, work)[0])


@budgets_group.command("remove")
@click.argument("project_id")
@click.argument("budget_id")
@pass_settings
def budgets_remove(settings: Settings, project_id: str, budget_id: str) -> None:
    """Remove a budget: its requests are no longer counted against it."""
    _run(settings, lambda ctx: budgets.remove_budget(ctx, project_id=project_id, budget_id=budget_id, actor=_actor()))
    click.echo(f"budget {budget_id} of project {project_id} removed")


@main.group("webhooks")
def webhooks_group() -> None:
    """A project's webhooks: where its events are posted, signed, and the delivery log."""


@webhooks_group.command("list")
@click.argument("project_id")
@pass_settings
def webhooks_list(settings: Settings, project_id: str) -> None:
    """The project's webhooks (never their secrets)."""
    _print(
        [WebhookOut.of(each) for each in _run(settings, lambda ctx: events.list_webhooks(ctx, project_id=project_id))]
    )


@webhooks_group.command("add")
@click.argument("project_id")
@click.argument("url")
@click.option(
    "--event",
    "types",
    multiple=True,
    help=f"An event type it takes (repeatable; none: every type): {', '.join(events.EVENT_TYPES)}.",
)
@pass_settings
def webhooks_add(settings: Settings, project_id: str, url: str, types: tuple[str, ...]) -> None:
    """Add a webhook; prints its signing secret, which is never shown again."""
    webhook, secret = _run(
        settings, lambda ctx: events.add_webhook(ctx, project_id=project_id, url=url, events=types, actor=_actor())
    )
    _print(WebhookSecretOut(webhook=WebhookOut.of(webhook), secret=secret))


@webhooks_group.command("update")
@click.argument("project_id")
@click.argument("webhook_id")
@click.option("--url", help="A new URL.")
@click.option("--event", "types", multiple=True, help="The event types it takes (replaces them).")
@click.option("--all-events", is_flag=True, help="Take every event type.")
@click.option("--enable/--disable", "enabled", default=None, help="Post events to it, or stop.")
@pass_settings
def webhooks_update(
    settings: Settings,
    project_id: str,
    webhook_id: str,
    url: str | None,
    types: tuple[str, ...],
    all_events: bool,
    enabled: bool | None,
) -> None:
    """Change a webhook's URL, event types, or whether it is enabled."""
    chosen = [] if all_events else (list(types) if types else None)
    found = _run(
        settings,
        lambda ctx: events.update_webhook(
            ctx, project_id=project_id, webhook_id=webhook_id, url=url, events=chosen, enabled=enabled, actor=_actor()
        ),
    )
    _print(WebhookOut.of(found))


@webhooks_group.command("test")
@click.argument("project_id")
@click.argument("webhook_id")
@pass_settings
def webhooks_test(settings: Settings, project_id: str, webhook_id: str) -> None:
    """Queue a webhook.test event for this webhook; a running gateway posts it within seconds."""
    event = _run(
        settings, lambda ctx: events.send_test_event(ctx, project_id=project_id, webhook_id=webhook_id, actor=_actor())
    )
    _print({"id": event.id, "type": event.type})


@webhooks_group.command("deliveries")
@click.argument("project_id")
@click.option("--webhook", "webhook_id", help="Only this webhook's.")
@click.option("--limit", default=50, show_default=True, **_limited(ListLimit, "How many, newest first"))
@pass_settings
def webhooks_deliveries(settings: Settings, project_id: str, webhook_id: str | None, limit: int) -> None:
    """The delivery log: each event to each webhook, its state, attempts and the receiver's last answer."""
    found = _run(
        settings,
        lambda ctx: events.list_deliveries(ctx, project_id=project_id, webhook_id=webhook_id, limit=limit),
    )
    _print([DeliveryOut.of(delivery) for delivery in found])


@webhooks_group.command("remove")
@click.argument("project_id")
@click.argument("webhook_id")
@pass_settings
def webhooks_remove(settings: Settings, project_id: str, webhook_id: str) -> None:
    """Remove a webhook, its secret and its deliveries."""
    _run(settings, lambda ctx: events.remove_webhook(ctx, project_id=project_id, webhook_id=webhook_id, actor=_actor()))
    click.echo(f"webhook {webhook_id} of project {project_id} removed")


@main.command("templates")
@pass_settings
def templates_list(settings: Settings) -> None:
    """List the integration templates, built-in and the data dir's own."""
    _print([TemplateOut.of(template) for template in _run(settings, _templates)])


async def _templates(ctx: Context) -> list[Template]:
    return list(ctx.templates.values())


@main.group("audit", invoke_without_command=True)
@click.option("--limit", default=50, show_default=True, **_limited(ListLimit, "How many, newest first"))
@click.option("--project", "project_id", help="Only this project's events.")
@pass_settings
def audit_group(settings: Settings, limit: int, project_id: str | None) -> None:
    """The audit log of changes, newest first; `export` and `verify` its hash chain."""
    if click.get_current_context().invoked_subcommand is not None:
        return
    events = _run(settings, lambda ctx: audit.list_audit_events(ctx, limit=limit, project_id=project_id))
    _print([AuditEventOut.of(event) for event in events])


@audit_group.command("export")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to this file, in place only once complete (default: standard output).",
)
@pass_settings
def audit_export(settings: Settings, output: Path | None) -> None:
    """Every entry of the audit log, oldest first, as JSON Lines with its previous_hash and hash.

    With --output, prints the number of entries and the head (the last entry's hash) once written.
    """

    async def export(ctx: Context, sink: BinaryIO) -> tuple[int, str]:
        entries, last = 0, None
        async for line in audit.export_audit_log(ctx):
            sink.write(line.encode())
            entries, last = entries + 1, line
        return entries, GENESIS if last is None else str(json.loads(last)["hash"])

    if output is None:
        _run(settings, lambda ctx: export(ctx, sys.stdout.buffer))
        sys.stdout.buffer.flush()
        return
    with _replacing(output) as sink:
        entries, head = _run(settings, lambda ctx: export(ctx, sink))
    click.echo(json.dumps({"entries": entries, "head": head}))


@contextmanager
def _replacing(path: Path) -> Iterator[BinaryIO]:
    """A new file (mode 0600) that takes `path`'s place once the block ends without error; else it is removed."""
    try:
        descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    except OSError as error:
        _fail(f"cannot write {path}: {error.strerror}", 2)
        raise AssertionError("unreachable") from None
    try:
        with os.fdopen(descriptor, "wb") as sink:
            yield sink
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


@audit_group.command("verify")
@click.argument("file", type=click.File("rb"), required=False)
@click.option("--database", is_flag=True, help="Check the chain stored in the database instead of an export.")
@pass_settings
def audit_verify(settings: Settings, file: BinaryIO | None, database: bool) -> None:
    """Check an export (FILE, or - for standard input): every hash and every link, from the first entry.

    Prints {"verified": true, "entries": N, "head": HASH}; else names the first broken line and exits 2
    (with --database, the first broken entry's id, and exits 5). Entries removed from the end of an export
    leave a shorter chain that still verifies: compare its head with the one --database reports.
    """
    if database == (file is not None):
        _fail("give an export FILE (- for standard input), or --database", 2)
    if file is None:
        stored = _run(settings, audit.verify_audit_log)
        if not stored.verified:
            where = "at its end" if stored.entry_id is None else f"at entry id {stored.entry_id}"
            verdict = {"verified": False, "entries": stored.entries, "id": stored.entry_id, "problem": stored.problem}
            _print_line(verdict)
            _fail(f"the audit log in the database does not verify {where}: {stored.problem}", 5)
        _print_line({"verified": True, "entries": stored.entries, "head": stored.head})
        return
    try:
        chain = verify_lines(file)
    except ChainBroken as broken:
        _print_line({"verified": False, "line": broken.position, "problem": broken.problem})
        _fail(f"line {broken.position}: {broken.problem}", 2)
        return
    _print_line({"verified": True, "entries": chain.entries, "head": chain.head})


def _print_line(value: dict[str, Any]) -> None:
    click.echo(json.dumps(value, ensure_ascii=False))
