"""An integration's key pool: its keys in order with their states, a key added (and checked with the provider
when asked), moved, disabled or enabled, removed, and the pool's strategy. A key is posted once, blank; no page
ever holds a stored one."""

from datetime import timedelta

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from credgate.admin_ui.base import Visit, field, form_of, redirect, render, visit
from credgate.admin_ui.messages import service_errors
from credgate.errors import Conflict, InvalidInput, ServiceError, Unavailable
from credgate.services import integrations, key_pools, projects, verification
from credgate.services.integrations import IntegrationChanges
from credgate.services.key_pools import key_state
from credgate.storage.models import Integration

STRATEGIES = {"failover": "Failover: in order, the next key when one is out", "spread": "Spread: the keys take turns"}
# How long a promoted key's predecessor stays as the fallback ("" keeps it until removed by hand).
OVERLAPS = {"3600": "1 hour", "86400": "1 day", "604800": "1 week", "0": "no overlap", "": "keep it"}

VERIFY_FIELD = "verify"  # the forms' "check the key with the provider after saving" box


async def _pool_page(
    request: Request, current: Visit, extra: dict[str, object] | None = None, status: int = 200
) -> Response:
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    project = await projects.get_project(current.ctx, project_id=project_id)
    integration = await integrations.get_integration(current.ctx, project_id=project_id, provider=provider)
    now = current.ctx.clock()
    policy = None if project.key_max_age_days is None else timedelta(days=project.key_max_age_days)
    context = {
        "project": project,
        "integration": integration,
        "keys": [
            (
                key,
                key_state(key),
                (now - key.secret_since).days,
                policy is not None and now - key.secret_since >= policy,
            )
            for key in integration.keys
        ],
        "overlaps": OVERLAPS,
        "strategies": STRATEGIES,
        "errors": {},
        "label": "",
        "can_verify": can_verify(current, integration),
        "verify": False,
    }
    return await render(request, "keys.html", context | (extra or {}), current=current, status=status)


def can_verify(current: Visit, integration: Integration) -> bool:
    """Whether the "check the key" box and the Verify buttons are offered: the running gateway makes the call, and
    the integration has one (its own, or its template's): without, nothing could be confirmed."""
    return current.panel.verify_key is not None and verification.verification_call(current.ctx, integration) is not None


def wants_verification(current: Visit, form: FormData) -> bool:
    """Whether the form's "check the key with the provider after saving" box was ticked (and can be honoured).

    The box starts unticked, like the admin API's `verify`: the check is a call to the provider that a save
    would wait on (up to its timeout), so the admin asks for it rather than every save making it."""
    return current.panel.verify_key is not None and field(form, VERIFY_FIELD) != ""


async def verification_note(current: Visit, *, project_id: str, provider: str, key_id: str | None = None) -> str:
    """The integration's cheap call with the key (the pool's `key_id`, else the first in service): what the
    provider said, as a sentence for the flash. The key itself is never in it."""
    verifier = current.panel.verify_key
    if verifier is None:
        raise Unavailable("key verification needs the running gateway")
    found = await verification.verify_provider_key(
        current.ctx, verifier, project_id=project_id, provider=provider, key_id=key_id
    )
    status = "" if found.status is None else f" (status {found.status})"
    return f"Verification: {found.message}{status}."


async def verification_after_save(current: Visit, *, project_id: str, provider: str, key_id: str | None = None) -> str:
    """`verification_note`, once the key is saved: a check that cannot be made says so and undoes nothing."""
    try:
        return await verification_note(current, project_id=project_id, provider=provider, key_id=key_id)
    except ServiceError as error:
        return f"The key could not be checked: {error.message}."


def _back(request: Request) -> str:
    return f"/admin/projects/{request.path_params['project_id']}/integrations/{request.path_params['provider']}/keys"


async def pool(request: Request) -> Response:
    return await _pool_page(request, await visit(request))


async def add(request: Request) -> Response:
    current = await visit(request, sensitive=True)
    form = await form_of(request, current)
    label, verify = field(form, "label"), wants_verification(current, form)
    try:
        _, key = await key_pools.add_key(
            current.ctx,
            project_id=request.path_params["project_id"],
            provider=request.path_params["provider"],
            api_key=str(form.get("api_key") or ""),
            label=label,
            actor=current.actor,
        )
    except (InvalidInput, Conflict) as error:
        # The label comes back; the key never does, and the message says so next to its field.
        errors = service_errors(error) if isinstance(error, InvalidInput) else {"api_key": error.message}
        if "api_key" not in errors:
            errors["api_key"] = "Enter the key again: it is never sent back to the page."
        extra = {"errors": errors, "label": label, "verify": verify}
        return await _pool_page(request, current, extra, status=422)
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    message = f"Key added to {provider}: it is in service now."
    if verify:
        note = await verification_after_save(current, project_id=project_id, provider=provider, key_id=key.id)
        message = f"{message} {note}"
    await current.flash(message)
    return redirect(_back(request))


async def change(request: Request) -> Response:
    """Move up, disable or enable a key (the button's `action`)."""
    current = await visit(request)
    form = await form_of(request, current)
    key_id, action = request.path_params["key_id"], field(form, "action")
    if action == "verify":
        return await _verify(request, current, key_id)
    if action == "promote":
        current.require_recent_sign_in()  # the key in service is retired, at once or after the overlap
        overlap = field(form, "overlap")
        await key_pools.promote_key(
            current.ctx,
            project_id=request.path_params["project_id"],
            provider=request.path_params["provider"],
            key_id=key_id,
            retire_previous_after_seconds=int(overlap) if overlap in OVERLAPS and overlap else None,
            actor=current.actor,
        )
        kept = "is kept" if not overlap else f"is removed after {OVERLAPS.get(overlap, 'the overlap')}"
        await current.flash(f"Key promoted: it serves first now; the previous first key {kept}.")
        return redirect(_back(request))
    found = await integrations.get_integration(
        current.ctx, project_id=request.path_params["project_id"], provider=request.path_params["provider"]
    )
    in_order = [key.id for key in found.keys]
    changes: dict[str, object] = {}
    if action == "up" and key_id in in_order[1:]:
        changes["position"] = in_order.index(key_id) - 1
    elif action in ("disable", "enable"):
        changes["disabled"] = action == "disable"
    await key_pools.update_key(
        current.ctx,
        project_id=request.path_params["project_id"],
        provider=request.path_params["provider"],
        key_id=key_id,
        actor=current.actor,
        **changes,  # type: ignore[arg-type]
    )
    done = {"up": "moved up", "disable": "disabled", "enable": "back in service"}.get(action, "unchanged")
    await current.flash(f"Key {done}.")
    return redirect(_back(request))


async def _verify(request: Request, current: Visit, key_id: str) -> Response:
    """The template's cheap call with this key, whatever its state; what the provider said, as a message."""
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    await current.flash(await verification_note(current, project_id=project_id, provider=provider, key_id=key_id))
    return redirect(_back(request))


async def remove_confirm(request: Request) -> Response:
    current = await visit(request, changing=True, sensitive=True)
    context = {
        "title": "Remove this key from the pool?",
        "consequence": "The key is destroyed. The other keys of the pool go on serving; with none left in service, "
        "every call to this provider gets 403 until a key is set.",
        "action": request.url.path,
        "button": "Remove key",
        "back": _back(request),
    }
    return await render(request, "confirm.html", context, current=current)


async def remove(request: Request) -> Response:
    current = await visit(request, sensitive=True)
    await form_of(request, current)
    await key_pools.remove_key(
        current.ctx,
        project_id=request.path_params["project_id"],
        provider=request.path_params["provider"],
        key_id=request.path_params["key_id"],
        actor=current.actor,
    )
    await current.flash("Key removed.")
    return redirect(_back(request))


async def strategy(request: Request) -> Response:
    current = await visit(request)
    form = await form_of(request, current)
    chosen = field(form, "key_strategy")
    if chosen not in STRATEGIES:
        errors = {"key_strategy": "Choose failover or spread."}
        return await _pool_page(request, current, {"errors": errors}, status=422)
    await integrations.update_integration(
        current.ctx,
        project_id=request.path_params["project_id"],
        provider=request.path_params["provider"],
        changes=IntegrationChanges(key_strategy=chosen),  # type: ignore[arg-type]
        actor=current.actor,
    )
    await current.flash(f"Strategy saved: {chosen}.")
    return redirect(_back(request))


_KEYS = "/projects/{project_id}/integrations/{provider}/keys"
routes = [
    Route(_KEYS, pool, methods=["GET"]),
    Route(_KEYS, add, methods=["POST"]),
    Route(f"{_KEYS}/strategy", strategy, methods=["POST"]),
    Route(_KEYS + "/{key_id}", change, methods=["POST"]),
    Route(_KEYS + "/{key_id}/remove", remove_confirm, methods=["GET"]),
    Route(_KEYS + "/{key_id}/remove", remove, methods=["POST"]),
]
