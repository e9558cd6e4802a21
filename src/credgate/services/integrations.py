"""Integrations: a project's connection to one provider, from a template or custom, named by provider."""

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from credgate.catalog import Template
from credgate.errors import Conflict, InvalidInput, NotFound
from credgate.limits import MAX_ENDPOINTS, StreamIdleTimeoutSeconds, TimeoutSeconds, TotalTimeoutSeconds, within
from credgate.netguard import PrivateNetworkList, PrivateNetworks, UpstreamRefused, check_upstream_url
from credgate.paths import rebase_path
from credgate.services.context import Context, new_id
from credgate.services.projects import require_project
from credgate.services.provider_keys import (
    clean_api_key,
    destroy_provider_key,
    open_provider_key,
    seal_provider_key,
)
from credgate.specs import (
    PROVIDER_NAME,
    AuthSpec,
    BaseUrl,
    BearerAuth,
    Endpoint,
    HeaderMap,
    KeyStrategy,
    ProviderName,
    QueryMap,
    VerifyCall,
)
from credgate.storage import Repository
from credgate.storage.models import Integration

DEFAULT_TIMEOUT_SECONDS = 600.0
DEFAULT_STREAM_IDLE_TIMEOUT_SECONDS = 300.0
# Ends a response that never stops (an endless or drip-fed stream); long enough for a model that thinks for many
# minutes before it streams its answer.
DEFAULT_TOTAL_TIMEOUT_SECONDS = 3600.0
# The audit log's own entry for a change of an integration's exceptions to the SSRF guard, holding the new list.
PRIVATE_NETWORKS_ACTION = "integration.private_networks"
# The timeouts of an integration, and what each must be (the panel's form reads them as numbers).
TIMEOUTS: dict[str, object] = {
    "timeout_seconds": TimeoutSeconds,
    "stream_idle_timeout_seconds": StreamIdleTimeoutSeconds,
    "total_timeout_seconds": TotalTimeoutSeconds,
}
# What each setting of IntegrationChanges must be; `auth` arrives as a validated AuthSpec.
_SETTINGS: dict[str, object] = {
    "base_url": BaseUrl,
    "enabled": bool,
    "headers": HeaderMap,
    "query": QueryMap,
    **TIMEOUTS,
    "key_strategy": KeyStrategy,
}


class Removal(Enum):
    """A change that takes a setting away (None in IntegrationChanges leaves it)."""

    REMOVE = "remove"


REMOVE: Literal[Removal.REMOVE] = Removal.REMOVE


@dataclass(frozen=True, slots=True)
class IntegrationChanges:
    """A partial update; None leaves a field as it is."""

    base_url: str | None = None
    auth: AuthSpec | None = None
    enabled: bool | None = None
    headers: dict[str, str] | None = None
    query: dict[str, str] | None = None
    timeout_seconds: float | None = None
    stream_idle_timeout_seconds: float | None = None
    total_timeout_seconds: float | None = None
    private_networks: list[str] | None = None  # replaces the list; [] removes every exception
    key_strategy: KeyStrategy | None = None
    verify_call: VerifyCall | Literal[Removal.REMOVE] | None = None  # REMOVE: its templates' call again


async def _check_upstream(
    ctx: Context, base_url: str | None, auth: AuthSpec | None = None, private_networks: Sequence[str] = ()
) -> None:
    """The SSRF guard on what the integration will call: its base URL and an OAuth token URL, within the
    integration's exceptions."""
    exceptions = PrivateNetworks.of(private_networks)
    for field, url in (("base_url", base_url), ("auth.token_url", getattr(auth, "token_url", None))):
        if url is None:
            continue
        try:
            await check_upstream_url(
                url, allow_private=ctx.allow_private_upstreams, exceptions=exceptions, ports=ctx.upstream_ports
            )
        except UpstreamRefused as error:
            raise InvalidInput(field, str(error)) from None


def _checked_private_networks(private_networks: Sequence[str] | None) -> list[str] | None:
    """The list normalised (networks in canonical form, names as the resolver sees them), or InvalidInput."""
    if private_networks is None:
        return None
    checked: list[str] = within("private_networks", PrivateNetworkList, list(private_networks))
    return checked


async def _audit_private_networks(ctx: Context, repo: Repository, actor: str, integration: Integration) -> None:
    """An entry of its own for the exceptions to the SSRF guard, naming the new list, in the change's transaction:
    called at the end of the change's body, since it takes the audit chain's lock until the commit."""
    await repo.append_audit_event(
        at=ctx.clock(),
        actor=actor,
        action=PRIVATE_NETWORKS_ACTION,
        project_id=integration.project_id,
        provider=integration.provider,
        detail={"private_networks": list(integration.private_networks)},
    )


async def require_integration(repo: Repository, project_id: str, provider: str) -> Integration:
    await require_project(repo, project_id)
    if not PROVIDER_NAME.fullmatch(provider):
        raise NotFound(f"project {project_id} has no such integration")  # the name is not quoted: see require_project
    integration = await repo.get_integration(project_id, provider)
    if integration is None:
        raise NotFound(f"project {project_id} has no integration {provider}")
    return integration


def _merge_endpoints(current: Sequence[dict[str, str]], added: Sequence[Endpoint]) -> list[dict[str, str]]:
    merged = list(current)
    for endpoint in added:
        entry = endpoint.model_dump()
        if entry not in merged:
            merged.append(entry)
    if len(merged) > MAX_ENDPOINTS:
        raise InvalidInput("endpoints", f"at most {MAX_ENDPOINTS} endpoints per integration")
    return merged


def _rebased(template: Template, base_url: str) -> list[Endpoint]:
    """The template's endpoints under the integration's own base URL, naming the same upstream paths (an
    integration set up before a template's base URL moved, or with a base URL of the user's own)."""
    return [
        Endpoint(method=endpoint.method, path=rebase_path(endpoint.path, from_base=template.base_url, to_base=base_url))
        for endpoint in template.endpoints
    ]


async def add_template_integration(
    ctx: Context,
    *,
    project_id: str,
    provider: str,
    template_id: str,
    actor: str,
    api_key: str | None = None,
    base_url: str | None = None,
    private_networks: Sequence[str] | None = None,
) -> tuple[Integration, bool]:
    """Set a provider up from a template, or add a template's endpoints to one already set up.

    Returns the integration and whether it was created. The key is asked only at the first setup.
    """
    within("provider", ProviderName, provider)
    template = ctx.templates.get(template_id)
    if template is None:
        raise InvalidInput("template", "no such template; GET /api/v1/templates lists them")
    if base_url is not None:
        base_url = within("base_url", BaseUrl, base_url)
    networks = _checked_private_networks(private_networks)
    await _check_upstream(ctx, base_url or template.base_url, private_networks=networks or ())
    async with ctx.change(actor=actor, action="integration.create", project_id=project_id, provider=provider) as repo:
        await require_project(repo, project_id)
        integration = await repo.get_integration(project_id, provider)
        if integration is not None:
            if api_key is not None:
                raise Conflict(f"{provider} is set up already and keeps its key; change it with PUT …/key")
            if base_url is not None and base_url != integration.base_url:
                raise Conflict(f"{provider} is set up already; change its base_url with PATCH")
            if networks is not None and networks != integration.private_networks:
                raise Conflict(f"{provider} is set up already; change its private_networks with PATCH")
            integration.endpoints = _merge_endpoints(integration.endpoints, _rebased(template, integration.base_url))
            if template.id not in integration.templates:
                integration.templates = [*integration.templates, template.id]
            integration.headers = template.headers | integration.headers
            integration.query = template.query | integration.query
            integration.updated_at = ctx.clock()
            return integration, False
        if api_key is None:
            raise InvalidInput("api_key", f"required at the first setup of {provider}")
        if template.requires_base_url and base_url is None:
            raise InvalidInput("base_url", f"required for {template.id}: give your own resource's URL")
        integration = _new_integration(
            ctx,
            project_id=project_id,
            provider=provider,
            base_url=base_url or template.base_url,
            auth=template.auth,
            templates=[template.id],
            endpoints=_merge_endpoints([], _rebased(template, base_url or template.base_url)),
            headers=dict(template.headers),
            query=dict(template.query),
            private_networks=networks or [],
        )
        seal_provider_key(
            ctx.keyring, integration, clean_api_key(api_key, auth_method=template.auth.method), now=ctx.clock()
        )
        repo.add(integration)
        if integration.private_networks:
            await _audit_private_networks(ctx, repo, actor, integration)
    return integration, True


async def add_custom_integration(
    ctx: Context,
    *,
    project_id: str,
    provider: str,
    base_url: str,
    api_key: str,
    actor: str,
    auth: AuthSpec | None = None,
    private_networks: Sequence[str] | None = None,
    verify_call: VerifyCall | None = None,
) -> Integration:
    """Set a provider up by hand; it allows no endpoint until they are configured."""
    within("provider", ProviderName, provider)
    base_url = within("base_url", BaseUrl, base_url)
    auth = auth or BearerAuth()
    networks = _checked_private_networks(private_networks) or []
    await _check_upstream(ctx, base_url, auth, networks)
    async with ctx.change(actor=actor, action="integration.create", project_id=project_id, provider=provider) as repo:
        await require_project(repo, project_id)
        if await repo.get_integration(project_id, provider) is not None:
            raise Conflict(f"project {project_id} has an integration {provider} already")
        integration = _new_integration(
            ctx,
            project_id=project_id,
            provider=provider,
            base_url=base_url,
            auth=auth,
            templates=[],
            endpoints=[],
            headers={},
            query={},
            private_networks=networks,
        )
        integration.verify_call = None if verify_call is None else verify_call.model_dump()
        seal_provider_key(ctx.keyring, integration, clean_api_key(api_key, auth_method=auth.method), now=ctx.clock())
        repo.add(integration)
        if networks:
            await _audit_private_networks(ctx, repo, actor, integration)
    return integration


def _new_integration(
    ctx: Context,
    *,
    project_id: str,
    provider: str,
    base_url: str,
    auth: AuthSpec,
    templates: list[str],
    endpoints: list[dict[str, str]],
    headers: dict[str, str],
    query: dict[str, str],
    private_networks: list[str],
) -> Integration:
    now = ctx.clock()
    return Integration(
        id=new_id("int"),
        project_id=project_id,
        provider=provider,
        base_url=base_url,
        auth=auth.model_dump(),
        templates=templates,
        endpoints=endpoints,
        headers=headers,
        query=query,
        enabled=True,
        timeout_seconds=DEFAULT_TIMEOUT_SECONDS,
        stream_idle_timeout_seconds=DEFAULT_STREAM_IDLE_TIMEOUT_SECONDS,
        total_timeout_seconds=DEFAULT_TOTAL_TIMEOUT_SECONDS,
        private_networks=private_networks,
        created_at=now,
        updated_at=now,
    )


async def add_integration(
    ctx: Context,
    *,
    project_id: str,
    provider: str,
    actor: str,
    template_id: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    auth: AuthSpec | None = None,
    private_networks: Sequence[str] | None = None,
    verify_call: VerifyCall | None = None,
) -> tuple[Integration, bool]:
    """From a template when `template_id` is given, else custom; returns the integration and whether it is new."""
    if template_id is not None:
        if auth is not None:
            raise InvalidInput("auth", "a template sets the auth method; change it later with PATCH")
        if verify_call is not None:
            raise InvalidInput("verify_call", "a template brings its own; set another later with PATCH")
        return await add_template_integration(
            ctx,
            project_id=project_id,
            provider=provider,
            template_id=template_id,
            api_key=api_key,
            base_url=base_url,
            private_networks=private_networks,
            actor=actor,
        )
    if base_url is None:
        raise InvalidInput("base_url", "required for a custom integration (or name a template)")
    if api_key is None:
        raise InvalidInput("api_key", "required for a custom integration")
    integration = await add_custom_integration(
        ctx,
        project_id=project_id,
        provider=provider,
        base_url=base_url,
        api_key=api_key,
        auth=auth,
        private_networks=private_networks,
        verify_call=verify_call,
        actor=actor,
    )
    return integration, True


async def list_integrations(ctx: Context, *, project_id: str) -> Sequence[Integration]:
    async with ctx.database.transaction(write=False) as repo:
        await require_project(repo, project_id)
        return await repo.list_integrations(project_id)


async def get_integration(ctx: Context, *, project_id: str, provider: str) -> Integration:
    async with ctx.database.transaction(write=False) as repo:
        return await require_integration(repo, project_id, provider)


async def update_integration(
    ctx: Context, *, project_id: str, provider: str, changes: IntegrationChanges, actor: str
) -> Integration:
    settings = {
        name: within(name, kind, getattr(changes, name))
        for name, kind in _SETTINGS.items()
        if getattr(changes, name) is not None
    }
    networks = _checked_private_networks(changes.private_networks)
    if "base_url" in settings or changes.auth is not None:
        # The URLs are checked within the exceptions they will have: the new list, or else the stored one (the
        # connect-time guard holds either way, should another admin change the list in the meantime).
        exceptions = networks
        if exceptions is None:
            exceptions = (await get_integration(ctx, project_id=project_id, provider=provider)).private_networks
        await _check_upstream(ctx, settings.get("base_url"), changes.auth, exceptions)
    async with ctx.change(actor=actor, action="integration.update", project_id=project_id, provider=provider) as repo:
        integration = await require_integration(repo, project_id, provider)
        if changes.auth is not None:
            if changes.auth.method == "basic":
                current = open_provider_key(ctx.keyring, integration)
                if current is not None and ":" not in current.reveal():
                    raise InvalidInput("auth", "basic auth needs the stored key as user:password; set the key first")
            integration.auth = changes.auth.model_dump()
        for name, value in settings.items():
            setattr(integration, name, value)
        if networks is not None and networks != integration.private_networks:
            integration.private_networks = networks
            await _audit_private_networks(ctx, repo, actor, integration)
        if changes.verify_call is not None:
            integration.verify_call = None if changes.verify_call is REMOVE else changes.verify_call.model_dump()
        integration.updated_at = ctx.clock()
    return integration


async def delete_integration(ctx: Context, *, project_id: str, provider: str, actor: str) -> None:
    async with ctx.change(actor=actor, action="integration.delete", project_id=project_id, provider=provider) as repo:
        await repo.delete(await require_integration(repo, project_id, provider))


async def set_endpoints(
    ctx: Context, *, project_id: str, provider: str, endpoints: Sequence[Endpoint], actor: str
) -> Integration:
    """Replace the integration's allow-list of endpoints."""
    action = "integration.endpoints_set"
    async with ctx.change(actor=actor, action=action, project_id=project_id, provider=provider) as repo:
        integration = await require_integration(repo, project_id, provider)
        integration.endpoints = _merge_endpoints([], endpoints)
        integration.updated_at = ctx.clock()
    return integration


async def set_provider_key(ctx: Context, *, project_id: str, provider: str, api_key: str, actor: str) -> Integration:
    """Edit or rotate the key; requests that start after this returns use the new one."""
    async with ctx.change(actor=actor, action="provider_key.set", project_id=project_id, provider=provider) as repo:
        integration = await require_integration(repo, project_id, provider)
        cleaned = clean_api_key(api_key, auth_method=integration.auth["method"])
        seal_provider_key(ctx.keyring, integration, cleaned, now=ctx.clock())
        integration.updated_at = ctx.clock()
    return integration


async def store_rotated_refresh_token(ctx: Context, *, project_id: str, provider: str, token: str) -> None:
    """Seal the refresh token a token endpoint returned in place of the one it consumed (OAuth 2.0)."""
    action = "provider_key.rotated_by_provider"
    async with ctx.change(
        actor="oauth2:token-endpoint", action=action, project_id=project_id, provider=provider
    ) as repo:
        integration = await require_integration(repo, project_id, provider)
        seal_provider_key(ctx.keyring, integration, token, now=ctx.clock())
        integration.updated_at = ctx.clock()


async def revoke_provider_key(ctx: Context, *, project_id: str, provider: str, actor: str) -> Integration:
    """Revoke the key: its ciphertext is destroyed, and requests that start after this get 403."""
    action = "provider_key.revoke"
    async with ctx.change(actor=actor, action=action, project_id=project_id, provider=provider) as repo:
        integration = await require_integration(repo, project_id, provider)
        destroy_provider_key(integration, now=ctx.clock())
        integration.updated_at = ctx.clock()
    return integration
