"""Confirming who you are before handing out or taking away a credential (ASVS 7.5.1): a page that does so
needs a sign-in within the last RECENT_SIGN_IN; an older session is sent here first, then back."""

from urllib.parse import urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from credgate.admin_ui.base import Visit, field, form_of, redirect, render, visit
from credgate.admin_ui.security import attempt_keys, panel_path
from credgate.errors import Unauthorized
from credgate.services import panel_sessions

MINUTES = int(panel_sessions.RECENT_SIGN_IN.total_seconds() // 60)


async def ask(request: Request, _error: Exception) -> Response:
    """The handler of RecentSignInRequired: nothing was done. What the form held (a key perhaps) is not carried
    through another page; the user comes back to the form to send it again."""
    return redirect(f"/admin/confirm?{urlencode({'next': _back_to(request)})}")


def _back_to(request: Request) -> str:
    """A form's own page; for a form posted, the page it was posted from (the Referer, same-origin only)."""
    page = urlsplit(str(request.url)) if request.method == "GET" else urlsplit(request.headers.get("referer", ""))
    if page.netloc != request.url.netloc:
        return panel_path("")
    return panel_path(page.path + (f"?{page.query}" if page.query else ""))


async def page(request: Request) -> Response:
    current = await visit(request, changing=False)
    return await _form(request, current, next_page=request.query_params.get("next", ""))


async def _form(request: Request, current: Visit, *, next_page: str, error: str = "", status: int = 200) -> Response:
    sso = current.panel.sso
    context = {
        "error": error,
        "next": panel_path(next_page),
        "minutes": MINUTES,
        "has_password": current.user.has_password,
        "sso_name": sso.name if sso else None,
    }
    return await render(request, "confirm_identity.html", context, current=current, status=status)


async def confirm(request: Request) -> Response:
    current = await visit(request, changing=False)
    form = await form_of(request, current)
    next_page = field(form, "next")
    keys = attempt_keys(request, current.user.username)
    throttle = current.panel.throttle
    wait = throttle.wait_seconds(*keys)
    if wait > 0:
        message = f"Too many failed attempts. Try again in {int(wait) + 1} seconds."
        return await _form(request, current, next_page=next_page, error=message, status=429)
    try:
        password = str(form.get("password") or "")
        await panel_sessions.confirm_password(current.ctx, session_id=current.user.session_id, password=password)
    except Unauthorized:
        throttle.failed(*keys)
        return await _form(request, current, next_page=next_page, error="Wrong password.", status=401)
    throttle.succeeded(*keys)
    await current.flash(f"Confirmed. For the next {MINUTES} minutes, you can hand out and take away credentials.")
    return redirect(panel_path(next_page))


routes = [
    Route("/confirm", page, methods=["GET"]),
    Route("/confirm", confirm, methods=["POST"]),
]
