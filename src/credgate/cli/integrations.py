"""`credgate integrations` and `credgate templates`: integrations, their settings, endpoints and prices."""

from typing import Any

import click
from pydantic import TypeAdapter, ValidationError

from credgate.admin_api.schemas import IntegrationIn, IntegrationOut, IntegrationPatchIn, TemplateOut
from credgate.catalog import Template
from credgate.cli.base import actor, fail, limited, main, pass_settings, print_json, read_secret, run
from credgate.config import Settings
from credgate.error_responses import validation_message
from credgate.limits import StreamIdleTimeoutSeconds, TimeoutSeconds, TotalTimeoutSeconds
from credgate.services import budgets, integrations
from credgate.services.context import Context
from credgate.specs import AuthSpec, Endpoint, VerifyCall
from credgate.storage.models import Integration

_auth_adapter: TypeAdapter[AuthSpec] = TypeAdapter(AuthSpec)


@main.group("integrations")
def integrations_group() -> None:
    """A project's provider integrations."""


def _parse_auth(auth: str | None) -> AuthSpec | None:
    if auth is None:
        return None
    try:
        return _auth_adapter.validate_json(auth)
    except ValidationError as error:
        fail(f"--auth: {validation_message(list(error.errors()))}", 2)
    raise AssertionError("unreachable")


def _parse_pairs(option: str, pairs: tuple[str, ...]) -> dict[str, str] | None:
    if not pairs:
        return None
    parsed = {}
    for pair in pairs:
        name, separator, value = pair.partition("=")
        if not separator or not name:
            fail(f"{option} takes NAME=VALUE", 2)
        parsed[name] = value
    return parsed


_VERIFY_CALL_HELP = (
    'The call that checks a key (`--verify`, `keys verify`), as "METHOD path" under the base URL: GET or POST, '
    'e.g. "GET models". Without it, the template\'s own.'
)


def _parse_verify_call(text: str | None) -> VerifyCall | None:
    if text is None:
        return None
    try:
        return VerifyCall.parse(text)
    except ValidationError as error:
        fail(f"--verify-call: {validation_message(list(error.errors()))}", 2)
    raise AssertionError("unreachable")


_PRIVATE_NETWORK_HELP = (
    "An exception to the SSRF guard for this integration alone (repeatable): an IP network (10.0.0.0/8), an "
    "address or a host name it may reach although not public, over plain http too; never link-local or metadata."
)


@integrations_group.command("list")
@click.argument("project_id")
@pass_settings
def integrations_list(settings: Settings, project_id: str) -> None:
    found = run(settings, lambda ctx: integrations.list_integrations(ctx, project_id=project_id))
    print_json([IntegrationOut.of(integration) for integration in found])


@integrations_group.command("show")
@click.argument("project_id")
@click.argument("provider")
@pass_settings
def integrations_show(settings: Settings, project_id: str, provider: str) -> None:
    found = run(settings, lambda ctx: integrations.get_integration(ctx, project_id=project_id, provider=provider))
    print_json(IntegrationOut.of(found))


@integrations_group.command("add")
@click.argument("project_id")
@click.argument("provider")
@click.option("--template", help="A template id (see `credgate templates`); omit for a custom integration.")
@click.option("--base-url", help="Required for a custom integration; overrides the template's.")
@click.option("--auth", help='Custom integrations: JSON, e.g. \'{"method": "header", "name": "x-api-key"}\'.')
@click.option("--api-key-stdin", is_flag=True, help="Read the provider API key from standard input.")
@click.option("--private-network", "private_networks", multiple=True, help=_PRIVATE_NETWORK_HELP)
@click.option("--verify-call", help=_VERIFY_CALL_HELP)
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
    verify_call: str | None,
) -> None:
    """Set a provider up in a project, from a template or custom."""
    api_key = read_secret("API key") if api_key_stdin else None
    fields: dict[str, Any] = {"provider": provider, "template": template, "base_url": base_url, "api_key": api_key}
    fields["auth"] = _parse_auth(auth)
    fields["private_networks"] = list(private_networks) or None
    fields["verify_call"] = _parse_verify_call(verify_call)
    try:
        request = IntegrationIn.model_validate({name: value for name, value in fields.items() if value is not None})
    except ValidationError as error:
        fail(validation_message(list(error.errors())), 2)

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
            verify_call=request.verify_call,
            actor=actor(),
        )
        return integration

    print_json(IntegrationOut.of(run(settings, work)))


@integrations_group.command("update")
@click.argument("project_id")
@click.argument("provider")
@click.option("--base-url")
@click.option("--auth", help="JSON auth method, as for `add`.")
@click.option("--enable/--disable", default=None)
@click.option(
    "--timeout-seconds", **limited(TimeoutSeconds, "How long to wait for the provider's response headers", whole=False)
)
@click.option(
    "--stream-idle-timeout",
    **limited(StreamIdleTimeoutSeconds, "Cut off a started response silent for this many seconds", whole=False),
)
@click.option(
    "--total-timeout",
    **limited(TotalTimeoutSeconds, "End a request still under way after this many seconds", whole=False),
)
@click.option("--header", "headers", multiple=True, help="NAME=VALUE; replaces all default headers.")
@click.option("--query", "query", multiple=True, help="NAME=VALUE; replaces all default query parameters.")
@click.option(
    "--private-network", "private_networks", multiple=True, help=_PRIVATE_NETWORK_HELP + " Replaces the list."
)
@click.option("--no-private-networks", is_flag=True, help="Remove every exception: the full SSRF guard again.")
@click.option("--verify-call", help=_VERIFY_CALL_HELP)
@click.option("--no-verify-call", is_flag=True, help="Remove the call set with --verify-call: the template's again.")
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
    verify_call: str | None,
    no_verify_call: bool,
) -> None:
    """Change an integration's settings."""
    if private_networks and no_private_networks:
        fail("--private-network and --no-private-networks exclude each other", 2)
    if verify_call is not None and no_verify_call:
        fail("--verify-call and --no-verify-call exclude each other", 2)
    fields: dict[str, Any] = {
        "base_url": base_url,
        "auth": _parse_auth(auth),
        "enabled": enable,
        "timeout_seconds": timeout_seconds,
        "stream_idle_timeout_seconds": stream_idle_timeout,
        "total_timeout_seconds": total_timeout,
        "headers": _parse_pairs("--header", headers),
        "query": _parse_pairs("--query", query),
        "private_networks": [] if no_private_networks else list(private_networks) or None,
        "verify_call": _parse_verify_call(verify_call),
    }
    sent: dict[str, Any] = {name: value for name, value in fields.items() if value is not None}
    if no_verify_call:
        sent["verify_call"] = None  # null: removed, as in the API
    try:
        patch = IntegrationPatchIn.model_validate(sent)
    except ValidationError as error:
        fail(validation_message(list(error.errors())), 2)
    changes = patch.changes()
    found = run(
        settings,
        lambda ctx: integrations.update_integration(
            ctx, project_id=project_id, provider=provider, changes=changes, actor=actor()
        ),
    )
    print_json(IntegrationOut.of(found))


@integrations_group.command("delete")
@click.argument("project_id")
@click.argument("provider")
@pass_settings
def integrations_delete(settings: Settings, project_id: str, provider: str) -> None:
    run(
        settings,
        lambda ctx: integrations.delete_integration(ctx, project_id=project_id, provider=provider, actor=actor()),
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
            fail(f"endpoint {entry!r}: {validation_message(list(error.errors()))}", 2)
    found = run(
        settings,
        lambda ctx: integrations.set_endpoints(
            ctx, project_id=project_id, provider=provider, endpoints=parsed, actor=actor()
        ),
    )
    print_json(IntegrationOut.of(found))


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
            fail(f"price {index}: must be MODEL=INPUT,OUTPUT, two numbers of dollars per million tokens", 2)
    found = run(
        settings,
        lambda ctx: budgets.set_prices(ctx, project_id=project_id, provider=provider, prices=lines, actor=actor()),
    )
    print_json(IntegrationOut.of(found))


@main.command("templates")
@pass_settings
def templates_list(settings: Settings) -> None:
    """List the integration templates, built-in and the data dir's own."""
    print_json([TemplateOut.of(template) for template in run(settings, _templates)])


async def _templates(ctx: Context) -> list[Template]:
    return list(ctx.templates.values())
