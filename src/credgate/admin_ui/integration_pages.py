"""Integrations: Add new API (provider, key, template, review, save), Custom Configure, endpoints, settings,
and the key's edit, rotate and revoke. No page ever holds a stored key: forms post it once, blank."""

from collections import defaultdict
from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from credgate.admin_ui.base import Visit, field, field_error, form_of, redirect, render, visit
from credgate.catalog import Template
from credgate.crypto import Secret
from credgate.error_responses import validation_message
from credgate.errors import Conflict, InvalidInput
from credgate.key_shapes import check_key_shape
from credgate.limits import StreamIdleTimeoutSeconds, TimeoutSeconds, parse_float
from credgate.services import integrations, panel_state, projects
from credgate.services.integrations import IntegrationChanges
from credgate.services.panel_state import PendingSetup
from credgate.services.provider_keys import key_hint
from credgate.specs import METHODS, AuthSpec, Endpoint, HeaderMap, QueryMap, check_base_url, check_provider_name

_auth: TypeAdapter[AuthSpec] = TypeAdapter(AuthSpec)
_headers: TypeAdapter[dict[str, str]] = TypeAdapter(HeaderMap)
_query: TypeAdapter[dict[str, str]] = TypeAdapter(QueryMap)
_endpoints: TypeAdapter[list[Endpoint]] = TypeAdapter(list[Endpoint])
_NEW_ENDPOINT_ROWS = 3


def _catalog(current: Visit) -> dict[str, list[Template]]:
    by_provider: dict[str, list[Template]] = defaultdict(list)
    for template in current.ctx.templates.values():
        by_provider[template.provider].append(template)
    return dict(sorted(by_provider.items()))


async def _existing(current: Visit, project_id: str) -> set[str]:
    return {
        integration.provider for integration in await integrations.list_integrations(current.ctx, project_id=project_id)
    }


# Add new API


async def add_api(request: Request) -> Response:
    """Step 1: the provider; step 2 (`?provider=`): the key (first setup only) and the template."""
    current = await visit(request)
    project = await projects.get_project(current.ctx, project_id=request.path_params["project_id"])
    catalog = _catalog(current)
    provider = request.query_params.get("provider", "")
    if provider not in catalog:
        return await render(request, "add_provider.html", {"project": project, "catalog": catalog}, current=current)
    context = {
        "project": project,
        "provider": provider,
        "name": provider,
        "templates": catalog[provider],
        "needs_key": provider not in await _existing(current, project.id),
        "errors": {},
    }
    return await render(request, "add_details.html", context, current=current)


async def add_api_submit(request: Request) -> Response:
    current = await visit(request)
    form = await form_of(request, current)
    project = await projects.get_project(current.ctx, project_id=request.path_params["project_id"])
    catalog = _catalog(current)
    provider, name, template_id = field(form, "provider"), field(form, "name"), field(form, "template")
    api_key = str(form.get("api_key") or "").strip()
    base_url = field(form, "base_url") or None
    existing = await _existing(current, project.id)
    errors: dict[str, str] = {}
    try:
        check_provider_name(name)
    except ValueError as error:
        errors["name"] = f"The name {error}."
    if template_id not in {template.id for template in catalog.get(provider, [])}:
        errors["template"] = "Pick the template that matches what you will call."
    if name not in existing and not api_key:
        errors["api_key"] = "Enter the provider's API key: it is asked only this first time."
    if name in existing and api_key:
        errors["api_key"] = "This provider is set up already and keeps its key; change it from the key table."
    template = current.ctx.templates.get(template_id)
    if base_url is not None:
        try:
            base_url = check_base_url(base_url)
        except ValueError as error:
            errors["base_url"] = f"The base URL {error}."
    elif template is not None and template.requires_base_url and name not in existing:
        errors["base_url"] = "This provider has an address per account: enter yours."
    if template is not None and api_key and "api_key" not in errors:
        try:
            check_key_shape(template.auth, api_key)
        except ValueError as error:
            errors["api_key"] = f"The key {error}."
    if errors:
        context = {
            "project": project,
            "provider": provider,
            "name": name,
            "templates": catalog.get(provider, []),
            "needs_key": name not in existing,
            "errors": errors,
            "chosen": template_id,
            "base_url": base_url or "",
        }
        return await render(request, "add_details.html", context, current=current, status=422)
    pending = PendingSetup(
        project_id=project.id,
        provider=name,
        template_id=template_id,
        api_key=Secret(api_key) if api_key else None,
        base_url=base_url if name not in existing else None,
    )
    await panel_state.hold_setup(current.ctx, session_id=current.user.session_id, setup=pending)
    return redirect(f"/admin/projects/{project.id}/add/review")


async def review(request: Request) -> Response:
    current = await visit(request)
    project_id = request.path_params["project_id"]
    pending = await panel_state.find_pending_setup(current.ctx, session_id=current.user.session_id)
    if pending is None or pending.project_id != project_id:
        return redirect(f"/admin/projects/{project_id}/add")
    project = await projects.get_project(current.ctx, project_id=project_id)
    template = current.ctx.templates[pending.template_id]
    hint = key_hint(pending.api_key.reveal(), auth_method=template.auth.method) if pending.api_key else None
    context = {"project": project, "pending": pending, "template": template, "hint": hint}
    return await render(request, "add_review.html", context, current=current)


async def save(request: Request) -> Response:
    current = await visit(request)
    await form_of(request, current)
    project_id = request.path_params["project_id"]
    pending = await panel_state.find_pending_setup(current.ctx, session_id=current.user.session_id)
    if pending is None or pending.project_id != project_id:
        return redirect(f"/admin/projects/{project_id}/add")
    integration, created = await integrations.add_template_integration(
        current.ctx,
        project_id=project_id,
        provider=pending.provider,
        template_id=pending.template_id,
        api_key=pending.api_key.reveal() if pending.api_key else None,
        base_url=pending.base_url,
        actor=current.actor,
    )
    await panel_state.release_setup(current.ctx, session_id=current.user.session_id)
    verb = "set up" if created else "extended with the template's endpoints; its stored key is kept"
    await current.flash(f"{integration.provider} {verb}.")
    return redirect(f"/admin/projects/{project_id}")


# Custom Configure


def _auth_from(form: FormData) -> dict[str, Any]:
    method = field(form, "auth_method") or "bearer"
    auth: dict[str, Any] = {"method": method}
    if method in ("header", "query"):
        auth["name"] = field(form, "auth_name")
    if method == "header":
        auth["prefix"] = str(form.get("auth_prefix") or "")
    if method == "oauth2_client_credentials":
        auth |= {"token_url": field(form, "token_url"), "client_id": field(form, "client_id")}
        auth |= {name: field(form, name) for name in ("scope", "audience") if field(form, name)}
    return auth


async def custom(request: Request) -> Response:
    current = await visit(request)
    project = await projects.get_project(current.ctx, project_id=request.path_params["project_id"])
    context = {"project": project, "errors": {}, "values": {"auth_method": "bearer"}}
    return await render(request, "custom.html", context, current=current)


async def custom_submit(request: Request) -> Response:
    current = await visit(request)
    form = await form_of(request, current)
    project = await projects.get_project(current.ctx, project_id=request.path_params["project_id"])
    names = (
        "provider",
        "base_url",
        "auth_method",
        "auth_name",
        "auth_prefix",
        "token_url",
        "client_id",
        "scope",
        "audience",
    )
    values = {name: field(form, name) for name in names}
    errors: dict[str, str] = {}
    try:
        check_provider_name(values["provider"])
    except ValueError as error:
        errors["provider"] = f"The name {error}."
    try:
        base_url = check_base_url(values["base_url"])
    except ValueError as error:
        errors["base_url"] = f"The base URL {error}."
    try:
        auth = _auth.validate_python(_auth_from(form))
    except ValidationError as error:
        errors["auth"] = validation_message(error.errors())
    api_key = str(form.get("api_key") or "")
    if not api_key.strip():
        errors["api_key"] = "Enter the API key."
    values["private_networks"] = str(form.get("private_networks") or "")
    if not errors:
        try:
            await integrations.add_custom_integration(
                current.ctx,
                project_id=project.id,
                provider=values["provider"],
                base_url=base_url,
                api_key=api_key,
                auth=auth,
                private_networks=_lines(values["private_networks"]),
                actor=current.actor,
            )
        except InvalidInput as error:
            errors |= field_error(error)
        except Conflict:
            errors["provider"] = "This project has an integration of that name already."
    if errors:
        context = {"project": project, "errors": errors, "values": values}
        return await render(request, "custom.html", context, current=current, status=422)
    await current.flash(f"{values['provider']} created. Now allow its endpoints.")
    return redirect(f"/admin/projects/{project.id}/integrations/{values['provider']}/endpoints")


# An integration's endpoints, settings and key


async def _integration_page(
    request: Request, current: Visit, page: str, extra: dict[str, Any] | None = None, status: int = 200
) -> Response:
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    project = await projects.get_project(current.ctx, project_id=project_id)
    integration = await integrations.get_integration(current.ctx, project_id=project_id, provider=provider)
    context = {"project": project, "integration": integration, "errors": {}, "methods": ("*", *METHODS)}
    return await render(request, page, context | (extra or {}), current=current, status=status)


async def endpoints(request: Request) -> Response:
    current = await visit(request)
    return await _integration_page(request, current, "endpoints.html", {"blank_rows": _NEW_ENDPOINT_ROWS})


async def endpoints_submit(request: Request) -> Response:
    current = await visit(request)
    form = await form_of(request, current)
    methods, paths, removed = form.getlist("method"), form.getlist("path"), set(form.getlist("remove"))
    rows = [
        {"method": str(method), "path": str(path).strip()}
        for index, (method, path) in enumerate(zip(methods, paths, strict=False))
        if str(path).strip() and str(index) not in removed
    ]
    try:
        chosen = _endpoints.validate_python(rows)
    except ValidationError as error:
        extra = {"blank_rows": _NEW_ENDPOINT_ROWS, "errors": {"endpoints": validation_message(error.errors())}}
        return await _integration_page(request, current, "endpoints.html", extra, status=422)
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    await integrations.set_endpoints(
        current.ctx, project_id=project_id, provider=provider, endpoints=chosen, actor=current.actor
    )
    await current.flash(f"Endpoints of {provider} saved.")
    return redirect(f"/admin/projects/{project_id}/integrations/{provider}/endpoints")


def _lines(text: str) -> list[str]:
    """One entry per non-blank line (private_networks)."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def _pairs(text: str) -> dict[str, str]:
    """`Name: value` lines (headers) or `name=value` lines (query parameters)."""
    pairs = {}
    for line in text.splitlines():
        if line.strip():
            separator = ":" if ":" in line and ("=" not in line or line.index(":") < line.index("=")) else "="
            name, _, value = line.partition(separator)
            pairs[name.strip()] = value.strip()
    return pairs


async def settings(request: Request) -> Response:
    current = await visit(request)
    return await _integration_page(request, current, "integration.html")


async def settings_submit(request: Request) -> Response:
    current = await visit(request)
    form = await form_of(request, current)
    errors: dict[str, str] = {}
    changes: dict[str, Any] = {
        "enabled": form.get("enabled") == "on",
        "private_networks": _lines(str(form.get("private_networks") or "")),
    }
    for name, parse in (("headers", _headers), ("query", _query)):
        try:
            changes[name] = parse.validate_python(_pairs(field(form, name)))
        except ValidationError as error:
            errors[name] = validation_message(error.errors())
    try:
        changes["base_url"] = check_base_url(field(form, "base_url"))
    except ValueError as error:
        errors["base_url"] = f"The base URL {error}."
    for name, kind in (("timeout_seconds", TimeoutSeconds), ("stream_idle_timeout_seconds", StreamIdleTimeoutSeconds)):
        try:
            changes[name] = parse_float(name, kind, field(form, name))
        except InvalidInput as error:
            errors |= field_error(error)
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    if not errors:
        try:
            await integrations.update_integration(
                current.ctx,
                project_id=project_id,
                provider=provider,
                changes=IntegrationChanges(**changes),
                actor=current.actor,
            )
        except InvalidInput as error:
            errors |= field_error(error)
    if errors:
        return await _integration_page(request, current, "integration.html", {"errors": errors}, status=422)
    await current.flash(f"Settings of {provider} saved.")
    return redirect(f"/admin/projects/{project_id}/integrations/{provider}")


async def key_form(request: Request) -> Response:
    current = await visit(request)
    mode = "rotate" if request.query_params.get("mode") == "rotate" else "edit"
    return await _integration_page(request, current, "key.html", {"mode": mode})


async def key_submit(request: Request) -> Response:
    current = await visit(request)
    form = await form_of(request, current)
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    mode = "rotate" if field(form, "mode") == "rotate" else "edit"
    try:
        await integrations.set_provider_key(
            current.ctx,
            project_id=project_id,
            provider=provider,
            api_key=str(form.get("api_key") or ""),
            actor=current.actor,
        )
    except InvalidInput as error:
        extra = {"mode": mode, "errors": field_error(error)}
        return await _integration_page(request, current, "key.html", extra, status=422)
    done = "rotated: requests from now on use the new key" if mode == "rotate" else "saved"
    await current.flash(f"Key of {provider} {done}.")
    return redirect(f"/admin/projects/{project_id}")


async def _confirm(
    request: Request, current: Visit, *, title: str, consequence: str, action: str, button: str
) -> Response:
    back = f"/admin/projects/{request.path_params['project_id']}"
    context = {"title": title, "consequence": consequence, "action": action, "button": button, "back": back}
    return await render(request, "confirm.html", context, current=current)


async def revoke_confirm(request: Request) -> Response:
    current = await visit(request)
    provider = request.path_params["provider"]
    return await _confirm(
        request,
        current,
        title=f"Revoke the key of {provider}?",
        button="Revoke key",
        action=request.url.path,
        consequence=f"The key is destroyed. Every call to /proxy/{provider}/… gets 403 until a new key is set.",
    )


async def revoke(request: Request) -> Response:
    current = await visit(request)
    await form_of(request, current)
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    await integrations.revoke_provider_key(current.ctx, project_id=project_id, provider=provider, actor=current.actor)
    await current.flash(f"Key of {provider} revoked.")
    return redirect(f"/admin/projects/{project_id}")


async def delete_confirm(request: Request) -> Response:
    current = await visit(request)
    provider = request.path_params["provider"]
    return await _confirm(
        request,
        current,
        title=f"Delete the integration {provider}?",
        button="Delete integration",
        action=request.url.path,
        consequence=f"Its key is destroyed and /proxy/{provider}/… answers 404.",
    )


async def delete(request: Request) -> Response:
    current = await visit(request)
    await form_of(request, current)
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    await integrations.delete_integration(current.ctx, project_id=project_id, provider=provider, actor=current.actor)
    await current.flash(f"Integration {provider} deleted.")
    return redirect(f"/admin/projects/{project_id}")


_INTEGRATION = "/projects/{project_id}/integrations/{provider}"
routes = [
    Route("/projects/{project_id}/add", add_api, methods=["GET"]),
    Route("/projects/{project_id}/add", add_api_submit, methods=["POST"]),
    Route("/projects/{project_id}/add/review", review, methods=["GET"]),
    Route("/projects/{project_id}/add/review", save, methods=["POST"]),
    Route("/projects/{project_id}/custom", custom, methods=["GET"]),
    Route("/projects/{project_id}/custom", custom_submit, methods=["POST"]),
    Route(_INTEGRATION, settings, methods=["GET"]),
    Route(_INTEGRATION, settings_submit, methods=["POST"]),
    Route(f"{_INTEGRATION}/endpoints", endpoints, methods=["GET"]),
    Route(f"{_INTEGRATION}/endpoints", endpoints_submit, methods=["POST"]),
    Route(f"{_INTEGRATION}/key", key_form, methods=["GET"]),
    Route(f"{_INTEGRATION}/key", key_submit, methods=["POST"]),
    Route(f"{_INTEGRATION}/revoke", revoke_confirm, methods=["GET"]),
    Route(f"{_INTEGRATION}/revoke", revoke, methods=["POST"]),
    Route(f"{_INTEGRATION}/delete", delete_confirm, methods=["GET"]),
    Route(f"{_INTEGRATION}/delete", delete, methods=["POST"]),
]
