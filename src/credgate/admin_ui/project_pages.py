"""Projects: list and create, a project's page (token, API key table, settings), usage, the audit log and its
export (the owner's, as in the admin API)."""

from collections.abc import AsyncIterator
from datetime import timedelta

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from credgate.admin_ui.base import field, field_error, form_of, redirect, render, visit
from credgate.admin_ui.charts import HEIGHT, WIDTH, bars
from credgate.admin_ui.end_user_forms import end_user_changes, origins_error, shown_fields, typed_fields
from credgate.errors import Conflict, InvalidInput
from credgate.limits import (
    ConcurrentRequests,
    ExpiresInDays,
    GraceSeconds,
    KeyMaxAgeDays,
    RateLimitPerMinute,
    parse_int,
)
from credgate.services import audit, integrations, projects, usage
from credgate.services.projects import current_token
from credgate.specs import IdentityProviderSpec

_CHART_DAYS = 14
# A rotated token's overlap: the previous one keeps working this long unless the form says otherwise, so that
# clients can move to the new one without an outage. The choices offered next to the field, in seconds.
DEFAULT_GRACE_SECONDS = 3600
GRACE_CHOICES = {
    0: "stops it at once",
    300: "5 minutes",
    3600: "1 hour (the default)",
    86400: "1 day",
    604800: "1 week",
}
# How the usage page's totals may be grouped: the `by` query parameter, and the table's first column.
USAGE_GROUPS = {"provider": "Provider", "subject": "End user"}


def duration_text(seconds: int) -> str:
    """A whole number of seconds as a person says it: "1 hour", "90 minutes", "2 days", "45 seconds"."""
    for unit, size in (("week", 604800), ("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def _whole_number(form: FormData, name: str, kind: object) -> int | None:
    """The form field as a whole number within `kind`; None when left empty."""
    text = field(form, name)
    return parse_int(name, kind, text) if text else None


async def list_projects(request: Request) -> Response:
    current = await visit(request)
    found = [project for project in await projects.list_projects(current.ctx) if current.principal.may_read(project.id)]
    rows = [(project, current_token(project)) for project in found]
    return await render(request, "projects.html", {"rows": rows, "errors": {}}, current=current)


async def create_project(request: Request) -> Response:
    current = await visit(request, sensitive=True)
    name = field(await form_of(request, current), "name")
    try:
        project, secret = await projects.create_project(current.ctx, name=name, actor=current.actor)
    except InvalidInput as error:
        rows = [(each, current_token(each)) for each in await projects.list_projects(current.ctx)]
        context = {"rows": rows, "errors": field_error(error)}
        return await render(request, "projects.html", context, current=current, status=422)
    await current.flash(f"Project {name} created.", secret=secret)
    return redirect(f"/admin/projects/{project.id}")


async def show_project(
    request: Request,
    *,
    errors: dict[str, str] | None = None,
    end_users: dict[str, str] | None = None,
    status: int = 200,
) -> Response:
    """The project's page; `end_users`: what was typed in its "Browser and end users" form, shown back."""
    current = await visit(request)
    project_id = request.path_params["project_id"]
    project = await projects.get_project(current.ctx, project_id=project_id)
    found = await integrations.list_integrations(current.ctx, project_id=project_id)
    context = {
        "project": project,
        "token": current_token(project),
        "integrations": found,
        "errors": errors or {},
        "end_users": end_users or shown_fields(project),
        "grace_default": DEFAULT_GRACE_SECONDS,
        "grace_choices": GRACE_CHOICES,
    }
    return await render(request, "project.html", context, current=current, status=status)


async def update_project(request: Request) -> Response:
    current = await visit(request)
    form = await form_of(request, current)
    project_id = request.path_params["project_id"]
    try:
        changes = projects.ProjectChanges(
            name=field(form, "name"),
            rate_limit_per_minute=_whole_number(form, "rate_limit_per_minute", RateLimitPerMinute),
            max_concurrent_requests=_whole_number(form, "max_concurrent_requests", ConcurrentRequests),
            key_max_age_days=_whole_number(form, "key_max_age_days", KeyMaxAgeDays),
        )
        await projects.update_project(current.ctx, project_id=project_id, changes=changes, actor=current.actor)
    except InvalidInput as error:
        return await show_project(request, errors=field_error(error), status=422)
    await current.flash("Project settings saved.")
    return redirect(f"/admin/projects/{project_id}")


async def update_end_users(request: Request) -> Response:
    """The "Browser and end users" settings: allowed origins, each end user's rate limit, the identity provider."""
    current = await visit(request)
    typed = typed_fields(await form_of(request, current))
    project_id = request.path_params["project_id"]
    try:
        changes = end_user_changes(typed)
        trusted = changes.identity_provider
        stored = (await projects.get_project(current.ctx, project_id=project_id)).identity_provider
        if (trusted.model_dump() if isinstance(trusted, IdentityProviderSpec) else None) != stored:
            current.require_recent_sign_in()  # whose tokens the gateway takes for this project's end users
        await projects.update_project(current.ctx, project_id=project_id, changes=changes, actor=current.actor)
    except InvalidInput as error:
        refused = origins_error(typed, error) if error.field.startswith("allowed_origins") else error
        return await show_project(request, errors=field_error(refused), end_users=typed, status=422)
    except Conflict as error:
        errors = {"identity_provider": f"{error.message[:1].upper()}{error.message[1:]}."}
        return await show_project(request, errors=errors, end_users=typed, status=409)
    await current.flash("Browser and end-user settings saved.")
    return redirect(f"/admin/projects/{project_id}")


async def rotate_token(request: Request) -> Response:
    current = await visit(request, sensitive=True)
    form = await form_of(request, current)
    project_id = request.path_params["project_id"]
    try:
        grace = _whole_number(form, "grace_seconds", GraceSeconds)
        grace = DEFAULT_GRACE_SECONDS if grace is None else grace
        expires = _whole_number(form, "expires_in_days", ExpiresInDays)
        _, secret = await projects.rotate_project_token(
            current.ctx,
            project_id=project_id,
            grace_seconds=grace,
            expires_in_seconds=None if expires is None else int(timedelta(days=expires).total_seconds()),
            actor=current.actor,
        )
    except InvalidInput as error:
        return await show_project(request, errors=field_error(error), status=422)
    kept = f"keeps working for {duration_text(grace)}" if grace else "stopped working"
    await current.flash(f"New project token issued; the previous token {kept}.", secret=secret)
    return redirect(f"/admin/projects/{project_id}")


async def confirm_revoke_token(request: Request) -> Response:
    current = await visit(request, changing=True, sensitive=True)
    project = await projects.get_project(current.ctx, project_id=request.path_params["project_id"])
    context = {
        "title": f"Revoke the token of {project.name}?",
        "consequence": "Every client that sends it gets 401 at once, and so does a previous token still in its "
        "overlap; client tokens minted with it stop too. Nothing can call this project until you issue a new "
        "token. To replace the token without an outage, use Rotate token with an overlap instead.",
        "action": f"/admin/projects/{project.id}/token/revoke",
        "button": "Revoke token",
        "back": f"/admin/projects/{project.id}",
    }
    return await render(request, "confirm.html", context, current=current)


async def revoke_token(request: Request) -> Response:
    current = await visit(request, sensitive=True)
    await form_of(request, current)
    project_id = request.path_params["project_id"]
    await projects.revoke_project_tokens(current.ctx, project_id=project_id, actor=current.actor)
    await current.flash("Project token revoked: no client can use it any more.")
    return redirect(f"/admin/projects/{project_id}")


async def confirm_delete(request: Request) -> Response:
    current = await visit(request, changing=True, sensitive=True)
    current.principal.require_owner("deleting a project")
    project = await projects.get_project(current.ctx, project_id=request.path_params["project_id"])
    context = {
        "title": f"Delete project {project.name}?",
        "consequence": "Its token stops working at once and every provider key it holds is destroyed.",
        "action": f"/admin/projects/{project.id}/delete",
        "button": "Delete project",
        "back": f"/admin/projects/{project.id}",
    }
    return await render(request, "confirm.html", context, current=current)


async def delete_project(request: Request) -> Response:
    current = await visit(request, sensitive=True)
    current.principal.require_owner("deleting a project")
    await form_of(request, current)
    await projects.delete_project(current.ctx, project_id=request.path_params["project_id"], actor=current.actor)
    await current.flash("Project deleted.")
    return redirect("/admin/projects")


async def show_usage(request: Request) -> Response:
    current = await visit(request)
    project_id = request.path_params["project_id"]
    project = await projects.get_project(current.ctx, project_id=project_id)
    _, _, by_day = await usage.summarize_usage(
        current.ctx, project_id=project_id, since=None, until=None, group_by="day"
    )
    _, _, by_provider = await usage.summarize_usage(
        current.ctx, project_id=project_id, since=None, until=None, group_by="provider"
    )
    by = request.query_params.get("by", "provider")
    by = by if by in USAGE_GROUPS else "provider"
    totals = by_provider
    if by != "provider":
        _, _, totals = await usage.summarize_usage(
            current.ctx, project_id=project_id, since=None, until=None, group_by=by
        )
    recent = await usage.list_request_records(current.ctx, project_id=project_id, limit=50)
    today = current.ctx.clock().date()
    days = [(today - timedelta(days=back)).isoformat() for back in range(_CHART_DAYS - 1, -1, -1)]
    requests, errors = {row.group: row.requests for row in by_day}, {row.group: row.errors for row in by_day}
    context = {
        "project": project,
        "requests_by_day": bars([(day[5:], requests.get(day, 0)) for day in days]),
        "errors_by_day": bars([(day[5:], errors.get(day, 0)) for day in days]),
        "tokens_by_provider": bars([(row.group, row.prompt_tokens + row.completion_tokens) for row in by_provider]),
        "by": by,
        "groups": USAGE_GROUPS,
        "totals": totals,
        "recent": recent,
        "chart_width": WIDTH,
        "chart_height": HEIGHT,
    }
    return await render(request, "usage.html", context, current=current)


async def show_audit(request: Request) -> Response:
    current = await visit(request)
    # An admin limited to some projects sees their entries among the latest, and none that names no project.
    events = [
        event
        for event in await audit.list_audit_events(current.ctx, limit=200)
        if current.principal.may_read(event.project_id)
    ]
    # Events name a project by id; the page shows its name too, and a deleted project's id as it was.
    names = {project.id: project.name for project in await projects.list_projects(current.ctx)}
    return await render(request, "audit.html", {"events": events, "names": names}, current=current)


async def export_audit(request: Request) -> Response:
    """The whole audit log as `GET /api/v1/audit/export` streams it (the same service, the same bytes), as a
    file to download and check with `credgate audit verify`; an owner's alone, as in the admin API."""
    current = await visit(request)
    current.principal.require_owner("exporting the audit log")
    lines = audit.export_audit_log(current.ctx)
    first = await anext(lines, None)  # the database answers before the first byte, or the error page does

    async def body() -> AsyncIterator[str]:
        if first is not None:
            yield first
            async for line in lines:
                yield line

    filename = f"credgate-audit-{current.ctx.clock().date().isoformat()}.jsonl"
    disposition = {"Content-Disposition": f'attachment; filename="{filename}"'}
    return StreamingResponse(body(), media_type="application/x-ndjson", headers=disposition)


routes = [
    Route("/projects", list_projects, methods=["GET"]),
    Route("/projects", create_project, methods=["POST"]),
    Route("/projects/{project_id}", show_project, methods=["GET"]),
    Route("/projects/{project_id}", update_project, methods=["POST"]),
    Route("/projects/{project_id}/end-users", update_end_users, methods=["POST"]),
    Route("/projects/{project_id}/token/rotate", rotate_token, methods=["POST"]),
    Route("/projects/{project_id}/token/revoke", confirm_revoke_token, methods=["GET"]),
    Route("/projects/{project_id}/token/revoke", revoke_token, methods=["POST"]),
    Route("/projects/{project_id}/delete", confirm_delete, methods=["GET"]),
    Route("/projects/{project_id}/delete", delete_project, methods=["POST"]),
    Route("/projects/{project_id}/usage", show_usage, methods=["GET"]),
    Route("/audit", show_audit, methods=["GET"]),
    Route("/audit/export", export_audit, methods=["GET"]),
]
