"""Integrations: Custom Configure, an integration's endpoints and settings, and the key's edit, rotate and revoke
(Add new API is add_api_pages.py). No page ever holds a stored key: forms post it once, blank, and a form refused
for another reason says to enter the key again. What else was typed comes back as it was, with each problem next
to its field or row. A form that saves a key offers to check it with the provider (key_pages' helpers)."""

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from credgate.admin_ui import add_api_pages, auth_form
from credgate.admin_ui.base import Visit, field, form_of, redirect, render, visit
from credgate.admin_ui.key_pages import can_verify, verification_after_save, wants_verification
from credgate.admin_ui.messages import line_error, row_errors, sentence, service_errors
from credgate.errors import Conflict, InvalidInput
from credgate.limits import parse_float
from credgate.services import integrations, projects, verification
from credgate.services.integrations import REMOVE, IntegrationChanges
from credgate.specs import (
    METHODS,
    Endpoint,
    HeaderMap,
    QueryMap,
    VerifyCall,
    check_base_url,
    check_header_name,
    check_provider_name,
)
from credgate.storage.models import Integration, Project

_headers: TypeAdapter[dict[str, str]] = TypeAdapter(HeaderMap)
_query: TypeAdapter[dict[str, str]] = TypeAdapter(QueryMap)
_endpoints: TypeAdapter[list[Endpoint]] = TypeAdapter(list[Endpoint])
_NEW_ENDPOINT_ROWS = 3
ENTER_KEY_AGAIN = "Enter the key again: it is never sent back to the page."


def _auth_context(values: dict[str, str], hint: str | None = None) -> dict[str, Any]:
    """What auth_fields.html needs besides `values` and `errors`."""
    return {
        "auth_methods": auth_form.METHODS,
        "client_auth": auth_form.CLIENT_AUTH,
        "auth_previews": auth_form.previews(values, hint),
        "key_hint": hint,
    }


# Custom Configure


def _custom_context(current: Visit, project: Project, values: dict[str, str], errors: dict[str, str]) -> dict[str, Any]:
    """What custom.html needs: the form as typed and its problems. The "check the key" box is offered where the
    running gateway can make the call; the form's own verification call is the one it makes."""
    context = {
        "project": project,
        "errors": errors,
        "values": values,
        "can_verify": current.panel.verify_key is not None,
    }
    return context | _auth_context(values)


async def custom(request: Request) -> Response:
    current = await visit(request, changing=True, sensitive=True)
    project = await projects.get_project(current.ctx, project_id=request.path_params["project_id"])
    context = _custom_context(current, project, {"auth_method": "bearer"}, {})
    return await render(request, "custom.html", context, current=current)


def _verify_call(text: str) -> tuple[VerifyCall | None, str | None]:
    """The verification call as typed ("GET models"; blank: none), or the problem with it."""
    if not text.strip():
        return None, None
    try:
        return VerifyCall.parse(text), None
    except ValidationError as error:
        label = f"the {error.errors()[0]['loc'][0]}"  # the method, the path
        return None, line_error(error, where="The verification call", label=label)


async def custom_submit(request: Request) -> Response:
    current = await visit(request, sensitive=True)
    form = await form_of(request, current)
    project = await projects.get_project(current.ctx, project_id=request.path_params["project_id"])
    values = {name: field(form, name) for name in ("provider", "base_url")} | auth_form.values_from(form)
    values["private_networks"] = str(form.get("private_networks") or "")
    values["verify_call"], verify = field(form, "verify_call"), wants_verification(current, form)
    errors: dict[str, str] = {}
    try:
        check_provider_name(values["provider"])
    except ValueError as error:
        errors["provider"] = sentence("the name", str(error))
    try:
        base_url = check_base_url(values["base_url"])
    except ValueError as error:
        errors["base_url"] = sentence("the base URL", str(error))
    auth, auth_errors = auth_form.read_auth(values)
    errors |= auth_errors
    api_key = str(form.get("api_key") or "")
    if not api_key.strip():
        errors["api_key"] = "Enter the API key."
    verify_call, problem = _verify_call(values["verify_call"])
    if problem is not None:
        errors["verify_call"] = problem
    elif verify and verify_call is None:
        errors["verify_call"] = "Name the call that checks the key, or leave the box unticked."
    if not errors and auth is not None:
        try:
            await integrations.add_custom_integration(
                current.ctx,
                project_id=project.id,
                provider=values["provider"],
                base_url=base_url,
                api_key=api_key,
                auth=auth,
                private_networks=_lines(values["private_networks"]),
                verify_call=verify_call,
                actor=current.actor,
            )
        except InvalidInput as error:
            errors |= service_errors(error)
        except Conflict:
            errors["provider"] = "This project has an integration of that name already."
    if errors:
        if "api_key" in errors:
            errors["api_key"] += f" {ENTER_KEY_AGAIN}" if api_key.strip() else ""
        elif api_key.strip():
            errors["api_key"] = f"Nothing was saved. {ENTER_KEY_AGAIN}"
        context = _custom_context(current, project, values, errors) | {"verify": verify}
        return await render(request, "custom.html", context, current=current, status=422)
    checked = ""
    if verify:
        checked = " " + await verification_after_save(current, project_id=project.id, provider=values["provider"])
    await current.flash(f"{values['provider']} created.{checked} Now allow its endpoints.")
    return redirect(f"/admin/projects/{project.id}/integrations/{values['provider']}/endpoints")


# An integration's endpoints, settings and key


async def _integration_page(
    request: Request, current: Visit, page: str, extra: dict[str, Any] | None = None, status: int = 200
) -> Response:
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    project = await projects.get_project(current.ctx, project_id=project_id)
    integration = await integrations.get_integration(current.ctx, project_id=project_id, provider=provider)
    context: dict[str, Any] = {"project": project, "integration": integration, "errors": {}}
    context["methods"] = ("*", *METHODS)
    if page == "endpoints.html":
        context["rows"] = _rows([EndpointRow(row["method"], row["path"]) for row in integration.endpoints])
    if page == "integration.html":
        context["values"] = _settings_of(integration)
        context["template_call"] = verification.template_call(current.ctx, integration)
    if page == "key.html":
        context |= {"can_verify": can_verify(current, integration), "verify": False}
    context |= extra or {}
    if page == "integration.html":
        context |= _auth_context(context["values"], integration.key.hint if integration.key else None)
    return await render(request, page, context, current=current, status=status)


@dataclass(frozen=True, slots=True)
class EndpointRow:
    """A row of the endpoints table as shown: stored, typed, or blank (`new`)."""

    method: str
    path: str
    removed: bool = False
    error: str | None = None
    new: bool = False


def _rows(filled: list[EndpointRow]) -> list[EndpointRow]:
    """The filled rows, then blank ones to type new endpoints into."""
    return filled + [EndpointRow("POST", "", new=True)] * _NEW_ENDPOINT_ROWS


async def endpoints(request: Request) -> Response:
    current = await visit(request)
    return await _integration_page(request, current, "endpoints.html")


async def endpoints_submit(request: Request) -> Response:
    """Save the rows as typed, all or nothing: a row that is not valid is shown with its problem, every row keeps
    what was typed in it, and nothing is stored until all are valid."""
    current = await visit(request)
    form = await form_of(request, current)
    methods, paths, removed = form.getlist("method"), form.getlist("path"), set(form.getlist("remove"))
    filled = [
        EndpointRow(str(method), str(path).strip(), removed=str(index) in removed)
        for index, (method, path) in enumerate(zip(methods, paths, strict=False))
        if str(path).strip()
    ]
    kept = [index for index, row in enumerate(filled) if not row.removed]
    try:
        chosen = _endpoints.validate_python([{"method": filled[i].method, "path": filled[i].path} for i in kept])
    except ValidationError as error:
        problems = row_errors(error, kept, {"path": "the path", "method": "the method"})
        return await _endpoints_refused(request, current, filled, problems)
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    try:
        await integrations.set_endpoints(
            current.ctx, project_id=project_id, provider=provider, endpoints=chosen, actor=current.actor
        )
    except InvalidInput as error:
        return await _endpoints_refused(request, current, filled, {}, service_errors(error).popitem()[1])
    none = ": none is allowed, so every call to it gets 403" if not chosen else ""
    await current.flash(f"Endpoints of {provider} saved{none}.")
    return redirect(f"/admin/projects/{project_id}/integrations/{provider}/endpoints")


async def _endpoints_refused(
    request: Request, current: Visit, filled: list[EndpointRow], problems: dict[int, str], summary: str = ""
) -> Response:
    rows = _rows(
        [
            EndpointRow(row.method, row.path, removed=row.removed, error=problems.get(index))
            for index, row in enumerate(filled)
        ]
    )
    if not summary:
        numbers = ", ".join(str(index + 1) for index in sorted(problems))
        summary = f"Nothing was saved: fix row{'s' if len(problems) > 1 else ''} {numbers}, then save again."
    extra = {"rows": rows, "errors": {"endpoints": summary}}
    return await _integration_page(request, current, "endpoints.html", extra, status=422)


def _lines(text: str) -> list[str]:
    """One entry per non-blank line (private_networks)."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def _pairs(text: str, kind: str) -> tuple[dict[str, str], str | None]:
    """`Name: value` lines (headers) or `name=value` lines (query parameters), each checked on its own, and the
    first problem, naming its line (from 1)."""
    what = {"headers": "Default headers", "query": "Default query parameters"}[kind]
    pairs: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        separator = ":" if ":" in line and ("=" not in line or line.index(":") < line.index("=")) else "="
        name, _, value = line.partition(separator)
        pair = {name.strip(): value.strip()}
        where = f"{what}, line {number}"
        if kind == "headers":
            try:
                check_header_name(name.strip())
            except ValueError as error:
                return pairs, line_error(error, where=where, label="the header name")
        try:
            pairs |= (_headers if kind == "headers" else _query).validate_python(pair)
        except ValidationError as error:
            return pairs, line_error(error, where=where, label=None if kind == "headers" else "the parameter name")
    try:
        return (_headers if kind == "headers" else _query).validate_python(pairs), None
    except ValidationError as error:
        return pairs, line_error(error, where=what, label=None)


def _settings_of(integration: Integration) -> dict[str, Any]:
    """The settings form's values, as stored."""
    return {
        "enabled": integration.enabled,
        "base_url": integration.base_url,
        "timeout_seconds": integration.timeout_seconds,
        "stream_idle_timeout_seconds": integration.stream_idle_timeout_seconds,
        "total_timeout_seconds": integration.total_timeout_seconds,
        "headers": "".join(f"{name}: {value}\n" for name, value in integration.headers.items()),
        "query": "".join(f"{name}={value}\n" for name, value in integration.query.items()),
        "private_networks": "".join(f"{entry}\n" for entry in integration.private_networks),
        "verify_call": _call_text(integration),
    } | auth_form.values_of(integration.auth)


def _call_text(integration: Integration) -> str:
    """The integration's own verification call as the form shows it (`GET models`), blank when it has none."""
    return "" if integration.verify_call is None else str(VerifyCall.model_validate(integration.verify_call))


def _settings_from(form: FormData, integration: Integration) -> dict[str, Any]:
    """The settings form's values, as posted (the auth fields as stored when the form has none)."""
    values: dict[str, Any] = {name: field(form, name) for name in ("base_url", *integrations.TIMEOUTS)}
    values |= {name: str(form.get(name) or "") for name in ("headers", "query", "private_networks")}
    # A form from a page older than the field (open while the gateway was upgraded) keeps the stored call.
    values["verify_call"] = field(form, "verify_call") if "verify_call" in form else _call_text(integration)
    values["enabled"] = form.get("enabled") == "on"
    posted = "auth_method" in form
    return values | (auth_form.values_from(form) if posted else auth_form.values_of(integration.auth))


async def settings(request: Request) -> Response:
    current = await visit(request)
    return await _integration_page(request, current, "integration.html")


async def settings_submit(request: Request) -> Response:
    current = await visit(request)
    form = await form_of(request, current)
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    integration = await integrations.get_integration(current.ctx, project_id=project_id, provider=provider)
    values = _settings_from(form, integration)
    errors: dict[str, str] = {}
    changes: dict[str, Any] = {"enabled": values["enabled"], "private_networks": _lines(values["private_networks"])}
    for name in ("headers", "query"):
        changes[name], problem = _pairs(values[name], name)
        if problem is not None:
            errors[name] = problem
    try:
        changes["base_url"] = check_base_url(values["base_url"])
    except ValueError as error:
        errors["base_url"] = sentence("the base URL", str(error))
    for name, kind in integrations.TIMEOUTS.items():
        try:
            changes[name] = parse_float(name, kind, values[name])
        except InvalidInput as error:
            errors |= service_errors(error)
    verify_call, problem = _verify_call(values["verify_call"])
    if problem is not None:
        errors["verify_call"] = problem
    elif verify_call is not None:
        changes["verify_call"] = verify_call
    elif integration.verify_call is not None:
        changes["verify_call"] = REMOVE  # blank: its templates' call again
    auth, auth_errors = auth_form.read_auth(values)
    errors |= auth_errors
    auth_changed = auth is not None and not auth_form.same_auth(integration.auth, auth)
    if auth_changed:
        changes["auth"] = auth
    if not errors:
        if auth_changed or changes["base_url"] != integration.base_url:
            current.require_recent_sign_in()  # where the key goes, and how, is the key's safety
        try:
            await integrations.update_integration(
                current.ctx,
                project_id=project_id,
                provider=provider,
                changes=IntegrationChanges(**changes),
                actor=current.actor,
            )
        except InvalidInput as error:
            errors |= service_errors(error)
        except Conflict as error:
            errors["form"] = sentence(None, error.message)
    if errors:
        extra = {"values": values, "errors": errors}
        return await _integration_page(request, current, "integration.html", extra, status=422)
    told = ""
    if auth_changed:
        told = " The key is now sent another way: if it does not fit the new method, set it again."
    await current.flash(f"Settings of {provider} saved.{told}")
    return redirect(f"/admin/projects/{project_id}/integrations/{provider}")


async def key_form(request: Request) -> Response:
    current = await visit(request, changing=True, sensitive=True)
    mode = "rotate" if request.query_params.get("mode") == "rotate" else "edit"
    return await _integration_page(request, current, "key.html", {"mode": mode})


async def key_submit(request: Request) -> Response:
    current = await visit(request, sensitive=True)
    form = await form_of(request, current)
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    mode = "rotate" if field(form, "mode") == "rotate" else "edit"
    verify = wants_verification(current, form)
    try:
        saved = await integrations.set_provider_key(
            current.ctx,
            project_id=project_id,
            provider=provider,
            api_key=str(form.get("api_key") or ""),
            actor=current.actor,
        )
    except InvalidInput as error:
        problems = service_errors(error)
        if "api_key" in problems:
            problems["api_key"] += f" {ENTER_KEY_AGAIN}"
        extra = {"mode": mode, "errors": problems, "verify": verify}
        return await _integration_page(request, current, "key.html", extra, status=422)
    done = "rotated: requests from now on use the new key" if mode == "rotate" else "saved"
    message = f"Key of {provider} {done}."
    if verify:
        message += " " + await _check_saved_key(current, saved)
    await current.flash(message)
    return redirect(f"/admin/projects/{project_id}")


async def _check_saved_key(current: Visit, integration: Integration) -> str:
    """The check with the provider of the key just saved (the pool's first, which the forms set), as a sentence."""
    key_id = integration.key.id if integration.key is not None else None
    return await verification_after_save(
        current, project_id=integration.project_id, provider=integration.provider, key_id=key_id
    )


async def _confirm(
    request: Request, current: Visit, *, title: str, consequence: str, action: str, button: str
) -> Response:
    back = f"/admin/projects/{request.path_params['project_id']}"
    context = {"title": title, "consequence": consequence, "action": action, "button": button, "back": back}
    return await render(request, "confirm.html", context, current=current)


async def revoke_confirm(request: Request) -> Response:
    current = await visit(request, changing=True, sensitive=True)
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
    current = await visit(request, sensitive=True)
    await form_of(request, current)
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    await integrations.revoke_provider_key(current.ctx, project_id=project_id, provider=provider, actor=current.actor)
    await current.flash(f"Key of {provider} revoked.")
    return redirect(f"/admin/projects/{project_id}")


async def delete_confirm(request: Request) -> Response:
    current = await visit(request, changing=True, sensitive=True)
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
    current = await visit(request, sensitive=True)
    await form_of(request, current)
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    await integrations.delete_integration(current.ctx, project_id=project_id, provider=provider, actor=current.actor)
    await current.flash(f"Integration {provider} deleted.")
    return redirect(f"/admin/projects/{project_id}")


_INTEGRATION = "/projects/{project_id}/integrations/{provider}"
routes = [
    *add_api_pages.routes,
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
