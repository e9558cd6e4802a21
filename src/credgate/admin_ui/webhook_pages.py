"""A project's webhooks: added (the signing secret shown once), tested, enabled or disabled, removed after a
confirmation; and the delivery log, newest first."""

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from credgate.admin_ui.base import Visit, field, field_error, form_of, redirect, render, visit
from credgate.errors import InvalidInput
from credgate.services import events, projects


async def _webhooks_page(
    request: Request, current: Visit, extra: dict[str, object] | None = None, status: int = 200
) -> Response:
    project_id = request.path_params["project_id"]
    project = await projects.get_project(current.ctx, project_id=project_id)
    hooks = await events.list_webhooks(current.ctx, project_id=project_id)
    context = {
        "project": project,
        "webhooks": hooks,
        "urls": {hook.id: hook.url for hook in hooks},
        "deliveries": await events.list_deliveries(current.ctx, project_id=project_id, limit=50),
        "event_types": events.EVENT_TYPES,
        "errors": {},
        "form": {"url": "", "events": []},
    }
    return await render(request, "webhooks.html", context | (extra or {}), current=current, status=status)


def _back(request: Request) -> str:
    return f"/admin/projects/{request.path_params['project_id']}/webhooks"


async def page(request: Request) -> Response:
    return await _webhooks_page(request, await visit(request))


async def add(request: Request) -> Response:
    current = await visit(request, sensitive=True)
    form = await form_of(request, current)
    url, chosen = field(form, "url"), [str(each) for each in form.getlist("events")]
    typed = {"url": url, "events": chosen}
    try:
        _, secret = await events.add_webhook(
            current.ctx, project_id=request.path_params["project_id"], url=url, events=chosen, actor=current.actor
        )
    except InvalidInput as error:
        return await _webhooks_page(request, current, {"errors": field_error(error), "form": typed}, status=422)
    await current.flash("Webhook added: events are posted to it from now on.", secret=secret)
    return redirect(_back(request))


async def change(request: Request) -> Response:
    """Test, enable or disable a webhook (the button's `action`)."""
    current = await visit(request)
    form = await form_of(request, current)
    project_id, webhook_id, action = (
        request.path_params["project_id"],
        request.path_params["webhook_id"],
        field(form, "action"),
    )
    if action == "test":
        await events.send_test_event(current.ctx, project_id=project_id, webhook_id=webhook_id, actor=current.actor)
        await current.flash("Test event queued: its delivery shows below within seconds (reload).")
    elif action in ("enable", "disable"):
        await events.update_webhook(
            current.ctx, project_id=project_id, webhook_id=webhook_id, enabled=action == "enable", actor=current.actor
        )
        await current.flash(f"Webhook {action}d.")
    return redirect(_back(request))


async def remove_confirm(request: Request) -> Response:
    current = await visit(request, changing=True, sensitive=True)
    context = {
        "title": "Remove this webhook?",
        "consequence": "No event is posted to it any more; its secret and its delivery log go with it.",
        "action": request.url.path,
        "button": "Remove webhook",
        "back": _back(request),
    }
    return await render(request, "confirm.html", context, current=current)


async def remove(request: Request) -> Response:
    current = await visit(request, sensitive=True)
    await form_of(request, current)
    await events.remove_webhook(
        current.ctx,
        project_id=request.path_params["project_id"],
        webhook_id=request.path_params["webhook_id"],
        actor=current.actor,
    )
    await current.flash("Webhook removed.")
    return redirect(_back(request))


_WEBHOOKS = "/projects/{project_id}/webhooks"
routes = [
    Route(_WEBHOOKS, page, methods=["GET"]),
    Route(_WEBHOOKS, add, methods=["POST"]),
    Route(_WEBHOOKS + "/{webhook_id}", change, methods=["POST"]),
    Route(_WEBHOOKS + "/{webhook_id}/remove", remove_confirm, methods=["GET"]),
    Route(_WEBHOOKS + "/{webhook_id}/remove", remove, methods=["POST"]),
]
