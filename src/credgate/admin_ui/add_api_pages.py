"""Add new API: the provider; then its key (first set-up only), base URL and template; then the review and save.

What was entered waits between the steps as the session's pending set-up (services/panel_state.py: sealed under the
master key, bound to the session, gone after ten minutes, at sign-out or once saved). The form is filled from it
again after Back or a refusal, so nothing typed is lost, while the key itself never goes back to the page: the form
says a key was entered, with its hint (…1234), and an empty key field keeps it. A key refused for its shape is not
kept, and the page says to enter it again. Every check Save makes (the SSRF guard on the base URL included) is made
before the review, and again at the review and at Save; a refusal is shown in the form, next to its field. Save
can check the new key with the provider once saved (key_pages.py), and says what the provider answered."""

from collections import defaultdict
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from credgate.admin_ui.base import Visit, field, form_of, redirect, render, visit
from credgate.admin_ui.key_pages import verification_after_save, wants_verification
from credgate.admin_ui.messages import sentence, service_errors
from credgate.catalog import Template
from credgate.crypto import Secret
from credgate.errors import Conflict, InvalidInput
from credgate.netguard import UpstreamRefused, check_upstream_url
from credgate.paths import rebase_path
from credgate.services import integrations, panel_state, projects
from credgate.services.key_pools import key_state
from credgate.services.panel_state import PendingSetup
from credgate.services.provider_keys import clean_api_key, key_hint
from credgate.specs import check_base_url, check_provider_name
from credgate.storage.models import Integration, Project

ENTER_AGAIN = "Enter it again: a refused key is not kept."


def _catalog(current: Visit) -> dict[str, list[Template]]:
    by_provider: dict[str, list[Template]] = defaultdict(list)
    for template in current.ctx.templates.values():
        by_provider[template.provider].append(template)
    return dict(sorted(by_provider.items()))


async def _existing(current: Visit, project_id: str) -> dict[str, Integration]:
    found = await integrations.list_integrations(current.ctx, project_id=project_id)
    return {integration.provider: integration for integration in found}


async def _draft(current: Visit, project_id: str, provider: str) -> PendingSetup | None:
    """The session's set-up of this project and catalog provider, if any: what the form shows again."""
    pending = await panel_state.find_pending_setup(current.ctx, session_id=current.user.session_id)
    if pending is None or pending.project_id != project_id:
        return None
    template = current.ctx.templates.get(pending.template_id)
    return pending if template is not None and template.provider == provider else None


def _key_note(integration: Integration) -> tuple[bool, str]:
    """Whether the integration has a key in service, and what happens to its key, as a clause."""
    states = {key_state(key) for key in integration.keys}
    if "active" in states:
        return True, "its stored key is kept"
    if states - {"revoked"}:
        return False, "it has no key in service (disabled, or refused by the provider): calls get 403 until one is back"
    return False, "its key was revoked, so calls get 403 until a key is added on its Keys page"


async def _refusal(current: Visit, url: str) -> str | None:
    """The SSRF guard's verdict on `url`, as the service will give it at Save (no exceptions listed here)."""
    try:
        ctx = current.ctx
        await check_upstream_url(url, allow_private=ctx.allow_private_upstreams, ports=ctx.upstream_ports)
    except UpstreamRefused as error:
        return str(error)
    return None


async def _problems(
    current: Visit, setup: PendingSetup, provider: str, existing: dict[str, Integration]
) -> dict[str, str]:
    """What Save would refuse in `setup`, by field."""
    errors: dict[str, str] = {}
    try:
        check_provider_name(setup.provider)
    except ValueError as error:
        errors["name"] = sentence("the name", str(error))
    template = current.ctx.templates.get(setup.template_id)
    if template is None or template.provider != provider:
        errors["template"] = "Pick the template that matches what you will call."
    integration = existing.get(setup.provider)
    if integration is None and setup.api_key is None:
        errors["api_key"] = "Enter the provider's API key: it is asked only this first time."
    if integration is not None and setup.api_key is not None:
        errors["api_key"] = "This provider is set up already and keeps its key; change it from the key table."
    if setup.base_url is not None:
        try:
            check_base_url(setup.base_url)
        except ValueError as error:
            errors["base_url"] = sentence("the base URL", str(error))
    elif template is not None and template.requires_base_url and integration is None:
        errors["base_url"] = "This provider has an address per account: enter yours."
    if template is not None and "base_url" not in errors:
        refusal = await _refusal(current, setup.base_url or template.base_url)
        if refusal is not None:
            errors["base_url"] = sentence("the base URL" if setup.base_url else "the template's base URL", refusal)
    if template is not None and setup.api_key is not None and "api_key" not in errors:
        try:
            clean_api_key(setup.api_key.reveal(), auth_method=template.auth.method)
        except InvalidInput as error:
            errors["api_key"] = sentence("the key", error.problem)
    return errors


async def _details(
    request: Request,
    current: Visit,
    project: Project,
    provider: str,
    setup: PendingSetup | None,
    existing: dict[str, Integration],
    errors: dict[str, str] | None = None,
    status: int = 200,
) -> Response:
    """Step 2, filled from `setup` when there is one."""
    errors = errors or {}
    templates = _catalog(current).get(provider, [])
    name = setup.provider if setup is not None else provider
    integration = existing.get(name)
    enabled = set(integration.templates) if integration is not None else set()
    default = next((template.id for template in templates if template.id not in enabled), "")
    kept = setup.api_key if setup is not None and integration is None and "api_key" not in errors else None
    method = templates[0].auth.method if templates else ""
    key_ok, key_note = _key_note(integration) if integration is not None else (True, "")
    context = {
        "project": project,
        "provider": provider,
        "name": name,
        "templates": templates,
        "chosen": setup.template_id if setup is not None else default or (templates[0].id if templates else ""),
        "enabled": enabled,
        "base_url": (setup.base_url if setup is not None else None) or "",
        "needs_key": integration is None,
        "integration": integration,
        "key_ok": key_ok,
        "key_note": key_note,
        "key_kept": kept is not None,
        "kept_hint": key_hint(kept.reveal(), auth_method=method) if kept is not None else None,
        "errors": errors,
    }
    return await render(request, "add_details.html", context, current=current, status=status)


async def add_api(request: Request) -> Response:
    """Step 1: the provider; step 2 (`?provider=`): the key (first setup only), base URL and template."""
    current = await visit(request, changing=True, sensitive=True)
    project = await projects.get_project(current.ctx, project_id=request.path_params["project_id"])
    catalog = _catalog(current)
    provider = request.query_params.get("provider", "")
    if provider not in catalog:
        return await render(request, "add_provider.html", {"project": project, "catalog": catalog}, current=current)
    existing = await _existing(current, project.id)
    return await _details(request, current, project, provider, await _draft(current, project.id, provider), existing)


def _base_url(typed: str) -> str | None:
    """The typed base URL, normalised when valid (the check itself comes with the others)."""
    if not typed:
        return None
    try:
        return check_base_url(typed)
    except ValueError:
        return typed


async def add_api_submit(request: Request) -> Response:
    current = await visit(request, sensitive=True)
    form = await form_of(request, current)
    project = await projects.get_project(current.ctx, project_id=request.path_params["project_id"])
    provider, name, typed = field(form, "provider"), field(form, "name"), str(form.get("api_key") or "").strip()
    existing = await _existing(current, project.id)
    draft = await _draft(current, project.id, provider)
    kept = draft.api_key if draft is not None and name not in existing else None
    setup = PendingSetup(
        project_id=project.id,
        provider=name,
        template_id=field(form, "template"),
        api_key=Secret(typed) if typed else kept,
        base_url=_base_url(field(form, "base_url")) if name not in existing else None,
    )
    errors = await _problems(current, setup, provider, existing)
    if "api_key" in errors and setup.api_key is not None:
        setup = replace(setup, api_key=None)
        if name not in existing:
            errors["api_key"] += f" {ENTER_AGAIN}"
    template = current.ctx.templates.get(setup.template_id)
    if template is None or template.provider != provider:  # a forged form: nothing to keep it under
        if setup.api_key is not None:
            errors["api_key"] = "Enter the key again: it was not kept."
        return await _details(request, current, project, provider, replace(setup, api_key=None), existing, errors, 422)
    await panel_state.hold_setup(current.ctx, session_id=current.user.session_id, setup=setup)
    if errors:
        return await _details(request, current, project, provider, setup, existing, errors, status=422)
    return redirect(f"/admin/projects/{project.id}/add/review")


async def _pending(request: Request, current: Visit) -> tuple[PendingSetup, Template] | None:
    pending = await panel_state.find_pending_setup(current.ctx, session_id=current.user.session_id)
    if pending is None or pending.project_id != request.path_params["project_id"]:
        return None
    template = current.ctx.templates.get(pending.template_id)
    return None if template is None else (pending, template)


async def review(request: Request) -> Response:
    current = await visit(request, changing=True, sensitive=True)
    project_id = request.path_params["project_id"]
    found = await _pending(request, current)
    if found is None:
        return redirect(f"/admin/projects/{project_id}/add")
    pending, template = found
    project = await projects.get_project(current.ctx, project_id=project_id)
    existing = await _existing(current, project_id)
    errors = await _problems(current, pending, template.provider, existing)
    if errors:
        return await _details(request, current, project, template.provider, pending, existing, errors, status=422)
    integration = existing.get(pending.provider)
    base_url = integration.base_url if integration is not None else pending.base_url or template.base_url
    allowed = integration.endpoints if integration is not None else []
    endpoints = []
    for endpoint in template.endpoints:
        path = rebase_path(endpoint.path, from_base=template.base_url, to_base=base_url)
        endpoints.append((endpoint.method, path, {"method": endpoint.method, "path": path} in allowed))
    key_ok, key_note = _key_note(integration) if integration is not None else (True, "")
    context = {
        "project": project,
        "pending": pending,
        "template": template,
        "integration": integration,
        "base_url": base_url,
        "endpoints": endpoints,
        "added": sum(not already for _, _, already in endpoints),
        "key_ok": key_ok,
        "key_note": key_note,
        "hint": key_hint(pending.api_key.reveal(), auth_method=template.auth.method) if pending.api_key else None,
        "can_verify": pending.api_key is not None
        and current.panel.verify_key is not None
        and template.verify is not None,
    }
    return await render(request, "add_review.html", context, current=current)


async def save(request: Request) -> Response:
    current = await visit(request, sensitive=True)
    form = await form_of(request, current)
    project_id = request.path_params["project_id"]
    found = await _pending(request, current)
    if found is None:
        return redirect(f"/admin/projects/{project_id}/add")
    pending, template = found
    existing = await _existing(current, project_id)
    errors = await _problems(current, pending, template.provider, existing)
    before = existing.get(pending.provider)
    if not errors:
        try:
            integration, created = await integrations.add_template_integration(
                current.ctx,
                project_id=project_id,
                provider=pending.provider,
                template_id=pending.template_id,
                api_key=pending.api_key.reveal() if pending.api_key else None,
                base_url=pending.base_url,
                actor=current.actor,
            )
        except InvalidInput as error:
            errors = service_errors(error)
        except Conflict:
            errors = {"name": "An integration of this name was set up meanwhile: review again, without a key."}
    if errors:
        project = await projects.get_project(current.ctx, project_id=project_id)
        return await _details(request, current, project, template.provider, pending, existing, errors, status=422)
    await panel_state.release_setup(current.ctx, session_id=current.user.session_id)
    message = _saved(integration, created, before, template)
    if pending.api_key is not None and wants_verification(current, form):  # only a first set-up saves a key
        message += " " + await verification_after_save(current, project_id=project_id, provider=integration.provider)
    await current.flash(message)
    return redirect(f"/admin/projects/{project_id}")


def _saved(integration: Integration, created: bool, before: Integration | None, template: Template) -> str:
    if created or before is None:
        return f"{integration.provider} set up."
    added = len(integration.endpoints) - len(before.endpoints)
    if not added:
        return f"Nothing changed: {integration.provider} already allowed every endpoint of {template.name}."
    endpoints = "endpoint" if added == 1 else "endpoints"
    return f"{integration.provider} extended with {added} {endpoints} of {template.name}; {_key_note(before)[1]}."


routes = [
    Route("/projects/{project_id}/add", add_api, methods=["GET"]),
    Route("/projects/{project_id}/add", add_api_submit, methods=["POST"]),
    Route("/projects/{project_id}/add/review", review, methods=["GET"]),
    Route("/projects/{project_id}/add/review", save, methods=["POST"]),
]
