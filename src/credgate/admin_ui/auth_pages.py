"""Sign-in, sign-out and the first-run setup link."""

import hmac

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from credgate.admin_ui.base import field, field_error, form_of, panel_of, redirect, render, visit
from credgate.admin_ui.security import (
    LOGIN_CSRF_COOKIE,
    attempt_keys,
    check_origin,
    cookie_options,
    new_csrf_token,
    session_cookie_name,
)
from credgate.errors import InvalidInput, Unauthorized
from credgate.services import panel_sessions


async def _login_form(request: Request, *, error: str = "", username: str = "", status: int = 200) -> Response:
    token = new_csrf_token()  # double-submit: no session exists yet to hold it
    # With no account yet, nobody can sign in: the page points at the setup link `credgate serve` printed.
    first_run = not await panel_sessions.admin_exists(panel_of(request).ctx)
    sso = panel_of(request).sso
    context = {
        "csrf": token,
        "error": error,
        "username": username,
        "first_run": first_run,
        "sso_name": sso.name if sso else None,
    }
    response = await render(request, "login.html", context, status=status)
    response.set_cookie(LOGIN_CSRF_COOKIE, token, max_age=3600, **cookie_options(request))  # type: ignore[arg-type]
    return response


async def login_page(request: Request) -> Response:
    return await _login_form(request)


async def login(request: Request) -> Response:
    check_origin(request)
    form = await request.form()
    posted, expected = field(form, "csrf"), request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if not expected or not hmac.compare_digest(posted.encode(), expected.encode()):
        return await _login_form(request, error="The form expired; please sign in again.", status=403)
    username, password = field(form, "username"), str(form.get("password") or "")
    panel = panel_of(request)
    keys = attempt_keys(request, username)
    wait = panel.throttle.wait_seconds(*keys)
    if wait > 0:
        message = f"Too many failed sign-ins. Try again in {int(wait) + 1} seconds."
        return await _login_form(request, error=message, username=username, status=429)
    try:
        secret, _ = await panel_sessions.sign_in(panel.ctx, username=username, password=password)
    except Unauthorized:
        panel.throttle.failed(*keys)
        return await _login_form(request, error="Wrong username or password.", username=username, status=401)
    panel.throttle.succeeded(*keys)
    response = redirect("/admin/projects")
    response.set_cookie(session_cookie_name(request), secret, **cookie_options(request))  # type: ignore[arg-type]
    response.delete_cookie(LOGIN_CSRF_COOKIE, path="/")
    return response


async def logout(request: Request) -> Response:
    current = await visit(request, changing=False)
    await form_of(request, current)
    await panel_sessions.sign_out(current.ctx, session_id=current.user.session_id)
    response = redirect("/admin/login")
    response.delete_cookie(session_cookie_name(request), path="/")
    return response


async def _setup_link_refused(request: Request) -> Response:
    """A used link says so and leads to the sign-in; any other says where a valid one comes from."""
    used = await panel_sessions.admin_exists(panel_of(request).ctx)
    message = (
        "This setup link is not valid any more: it has been used already" if used else "This setup link is not valid"
    )
    context = {"status": 404, "message": message, "reason": "setup-used" if used else "setup-unknown"}
    return await render(request, "error.html", context, status=404)


async def setup_page(request: Request) -> Response:
    token = request.query_params.get("token", "")
    if not await panel_sessions.setup_token_valid(panel_of(request).ctx, token=token):
        return await _setup_link_refused(request)
    return await render(request, "setup.html", {"token": token, "errors": {}, "username": ""})


async def setup(request: Request) -> Response:
    check_origin(request)
    form = await request.form()
    token, username = field(form, "token"), field(form, "username")
    password, again = str(form.get("password") or ""), str(form.get("password_again") or "")
    errors = {}
    if password != again:
        errors["password_again"] = "The two passwords differ."  # noqa: S105 - a message, not a password
    else:
        try:
            await panel_sessions.redeem_setup_token(
                panel_of(request).ctx, token=token, username=username, password=password
            )
        except InvalidInput as error:
            errors |= field_error(error)
        except Unauthorized:
            return await _setup_link_refused(request)
    if errors:
        return await render(request, "setup.html", {"token": token, "errors": errors, "username": username}, status=422)
    return redirect("/admin/login?created=1")


routes = [
    Route("/login", login_page, methods=["GET"]),
    Route("/login", login, methods=["POST"]),
    Route("/logout", logout, methods=["POST"]),
    Route("/setup", setup_page, methods=["GET"]),
    Route("/setup", setup, methods=["POST"]),
]
