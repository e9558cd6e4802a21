"""Admins, the owner's page: panel users and admin tokens listed, added (a token's value shown once), given another
role, and deleted or revoked after a confirmation. The last owner is kept (services/admins.py)."""

from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from credgate.admin_ui.base import Visit, field, form_of, redirect, render, visit
from credgate.admin_ui.messages import sentence
from credgate.errors import Conflict, InvalidInput
from credgate.roles import Role
from credgate.services import admins, projects

PAGE = "/admin/admins"
ROLE_NAMES = {Role.OWNER: "Owner", Role.PROJECT_ADMIN: "Project admin", Role.VIEWER: "Viewer"}
# A service's field (InvalidInput.field) as a sentence names it; None: the problem names its own subject.
_LABELS = {"username": "the username", "password": "the password", "name": "the name", "role": "the role"}


async def _owner(request: Request, *, changing: bool | None = None, sensitive: bool = False) -> Visit:
    """The signed-in owner; Forbidden for any other role, whatever the method (reading admins is the owner's too)."""
    current = await visit(request, changing=changing, sensitive=sensitive)
    current.principal.require_owner("managing admins")
    return current


def _refusal(error: InvalidInput) -> dict[str, str]:
    return {error.field: sentence(_LABELS.get(error.field), error.problem)}


def _grant(form: FormData) -> dict[str, Any]:
    """The role and projects a form chose; an owner's ticks are dropped, for an owner has every project."""
    role = field(form, "role")
    ticked = [str(each) for each in form.getlist("project_ids")]
    return {"role": role, "project_ids": [] if role == Role.OWNER else ticked}


async def _page(
    request: Request,
    current: Visit,
    *,
    failed: str = "",
    typed: dict[str, Any] | None = None,
    errors: dict[str, str] | None = None,
    status: int = 200,
) -> Response:
    """The page; `failed` names the form refused (`user`, `token`, `user:<id>`, `token:<id>`), which shows
    `typed` (never a password) and `errors` next to its fields."""
    found = await projects.list_projects(current.ctx)
    context = {
        "users": await admins.list_admin_users(current.ctx),
        "tokens": await admins.list_admin_tokens(current.ctx),
        "projects": found,
        "names": {project.id: project.name for project in found},
        "roles": ROLE_NAMES,
        "sso": current.panel.sso is not None,
        "failed": failed,
        "typed": typed or {},
        "errors": errors or {},
    }
    return await render(request, "admins.html", context, current=current, status=status)


async def page(request: Request) -> Response:
    return await _page(request, await _owner(request))


async def add_user(request: Request) -> Response:
    current = await _owner(request, sensitive=True)
    form = await form_of(request, current)
    typed = {"username": field(form, "username"), "sign_in": field(form, "sign_in"), **_grant(form)}
    single_sign_on = typed["sign_in"] == "single_sign_on"
    try:
        user = await admins.create_admin_user(
            current.ctx,
            username=typed["username"],
            password=None if single_sign_on else str(form.get("password") or ""),
            role=typed["role"],
            project_ids=typed["project_ids"],
            actor=current.actor,
        )
    except InvalidInput as error:
        return await _page(request, current, failed="user", typed=typed, errors=_refusal(error), status=422)
    except Conflict as error:
        errors = {"username": sentence(None, error.message)}
        return await _page(request, current, failed="user", typed=typed, errors=errors, status=409)
    how = "through single sign-on, as that email address" if single_sign_on else "with the password you set"
    await current.flash(f"User {user.username} added: it signs in {how}.")
    return redirect(PAGE)


async def set_user_role(request: Request) -> Response:
    current = await _owner(request, sensitive=True)
    form = await form_of(request, current)
    user = await admins.get_admin_user(current.ctx, user_id=request.path_params["user_id"])
    typed = _grant(form)
    try:
        await admins.set_admin_role(current.ctx, username=user.username, actor=current.actor, **typed)
    except InvalidInput as error:
        return await _page(request, current, failed=f"user:{user.id}", typed=typed, errors=_refusal(error), status=422)
    except Conflict as error:
        errors = {"role": sentence(None, error.message)}
        return await _page(request, current, failed=f"user:{user.id}", typed=typed, errors=errors, status=409)
    await current.flash(f"{user.username} is now {ROLE_NAMES[Role(typed['role'])].lower()}, from its next page.")
    # Who gave up being an owner may not see this page any more.
    return redirect("/admin/projects" if user.username == current.user.username else PAGE)


async def end_user_sessions(request: Request) -> Response:
    current = await _owner(request)
    await form_of(request, current)
    user = await admins.get_admin_user(current.ctx, user_id=request.path_params["user_id"])
    ended = await admins.end_admin_sessions(current.ctx, username=user.username, actor=current.actor)
    if user.username == current.user.username:
        return redirect("/admin/login")  # this session was one of them
    await current.flash(f"{ended} session{'' if ended == 1 else 's'} of {user.username} ended: it signs in again.")
    return redirect(PAGE)


async def confirm_delete_user(request: Request) -> Response:
    current = await _owner(request, changing=True, sensitive=True)
    user = await admins.get_admin_user(current.ctx, user_id=request.path_params["user_id"])
    yourself = " This is you: you are signed out too." if user.username == current.user.username else ""
    context = {
        "title": f"Delete user {user.username}?",
        "consequence": f"It can no longer sign in, and each of its sessions ends at once.{yourself}",
        "action": request.url.path,
        "button": "Delete user",
        "back": PAGE,
    }
    return await render(request, "confirm.html", context, current=current)


async def delete_user(request: Request) -> Response:
    current = await _owner(request, sensitive=True)
    await form_of(request, current)
    user = await admins.get_admin_user(current.ctx, user_id=request.path_params["user_id"])
    try:
        await admins.delete_admin_user(current.ctx, username=user.username, actor=current.actor)
    except Conflict as error:
        errors = {"row": sentence(None, error.message)}
        return await _page(request, current, failed=f"user:{user.id}", errors=errors, status=409)
    if user.username == current.user.username:
        return redirect("/admin/login")  # the session went with the user
    await current.flash(f"User {user.username} deleted: its sessions have ended.")
    return redirect(PAGE)


async def add_token(request: Request) -> Response:
    current = await _owner(request, sensitive=True)
    form = await form_of(request, current)
    typed = {"name": field(form, "name"), **_grant(form)}
    try:
        _, secret = await admins.issue_admin_token(current.ctx, actor=current.actor, **typed)
    except InvalidInput as error:
        return await _page(request, current, failed="token", typed=typed, errors=_refusal(error), status=422)
    await current.flash(f"Admin token {typed['name']} created.", secret=secret)
    return redirect(PAGE)


async def set_token_role(request: Request) -> Response:
    current = await _owner(request, sensitive=True)
    form = await form_of(request, current)
    token = await admins.get_admin_token(current.ctx, token_id=request.path_params["token_id"])
    typed = _grant(form)
    failed = f"token:{token.id}"
    try:
        await admins.set_admin_token_role(current.ctx, token_id=token.id, actor=current.actor, **typed)
    except InvalidInput as error:
        return await _page(request, current, failed=failed, typed=typed, errors=_refusal(error), status=422)
    except Conflict as error:
        errors = {"role": sentence(None, error.message)}
        return await _page(request, current, failed=failed, typed=typed, errors=errors, status=409)
    await current.flash(f"Admin token {token.name} is now {ROLE_NAMES[Role(typed['role'])].lower()}.")
    return redirect(PAGE)


async def confirm_revoke_token(request: Request) -> Response:
    current = await _owner(request, changing=True, sensitive=True)
    token = await admins.get_admin_token(current.ctx, token_id=request.path_params["token_id"])
    context = {
        "title": f"Revoke admin token {token.name}?",
        "consequence": f"Every script or tool that sends {token.prefix}… gets 401 from its next request on. "
        "It cannot be restored: create a new token instead.",
        "action": request.url.path,
        "button": "Revoke token",
        "back": PAGE,
    }
    return await render(request, "confirm.html", context, current=current)


async def revoke_token(request: Request) -> Response:
    current = await _owner(request, sensitive=True)
    await form_of(request, current)
    token = await admins.get_admin_token(current.ctx, token_id=request.path_params["token_id"])
    try:
        await admins.revoke_admin_token(current.ctx, token_id=token.id, actor=current.actor)
    except Conflict as error:
        errors = {"row": sentence(None, error.message)}
        return await _page(request, current, failed=f"token:{token.id}", errors=errors, status=409)
    await current.flash(f"Admin token {token.name} revoked: it works no more.")
    return redirect(PAGE)


routes = [
    Route("/admins", page, methods=["GET"]),
    Route("/admins/users", add_user, methods=["POST"]),
    Route("/admins/users/{user_id}/role", set_user_role, methods=["POST"]),
    Route("/admins/users/{user_id}/sessions/end", end_user_sessions, methods=["POST"]),
    Route("/admins/users/{user_id}/delete", confirm_delete_user, methods=["GET"]),
    Route("/admins/users/{user_id}/delete", delete_user, methods=["POST"]),
    Route("/admins/tokens", add_token, methods=["POST"]),
    Route("/admins/tokens/{token_id}/role", set_token_role, methods=["POST"]),
    Route("/admins/tokens/{token_id}/revoke", confirm_revoke_token, methods=["GET"]),
    Route("/admins/tokens/{token_id}/revoke", revoke_token, methods=["POST"]),
]
