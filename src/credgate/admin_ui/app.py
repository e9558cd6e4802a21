"""create_panel(): the panel's Starlette app, its pages, static files and error pages."""

import logging
from collections.abc import Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from credgate.admin_ui import (
    admin_pages,
    auth_pages,
    budget_pages,
    confirm_pages,
    integration_pages,
    key_pages,
    project_pages,
    sso_pages,
    webhook_pages,
)
from credgate.admin_ui.base import Panel, RecentSignInRequired, SignInRequired, Visit, panel_of, render
from credgate.admin_ui.security import SecurityHeaders, session_cookie_name
from credgate.errors import ServiceError
from credgate.services.context import Context
from credgate.services.panel_sessions import resume_session
from credgate.services.verification import KeyVerifier

HERE = Path(__file__).parent
logger = logging.getLogger(__name__)


def create_panel(
    get_context: Callable[[], Context],
    verify_key: KeyVerifier | None = None,
    sso: sso_pages.SingleSignOn | None = None,
) -> SecurityHeaders:
    """The panel; `get_context` gives the services' context once the gateway has started, `verify_key` makes a
    key's verification call, `sso` is the single sign-on's provider if one is set up."""
    routes = [
        Route("/", lambda request: RedirectResponse("/admin/projects", status_code=303)),
        *auth_pages.routes,
        *confirm_pages.routes,
        *sso_pages.routes,
        *project_pages.routes,
        *integration_pages.routes,
        *key_pages.routes,
        *budget_pages.routes,
        *webhook_pages.routes,
        *admin_pages.routes,
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            SignInRequired: _sign_in,
            RecentSignInRequired: confirm_pages.ask,
            ServiceError: _service_error,
            HTTPException: _http_error,
        },
    )
    app.state.panel = Panel(get_context, verify_key, sso)
    return SecurityHeaders(app)


async def _sign_in(request: Request, _error: Exception) -> Response:
    return RedirectResponse("/admin/login", status_code=303)


async def _service_error(request: Request, error: Exception) -> Response:
    if not isinstance(error, ServiceError):
        raise error
    return await _error_page(request, error.status, error.message)


async def _http_error(request: Request, error: Exception) -> Response:
    if not isinstance(error, HTTPException):
        raise error
    message = "page not found" if error.status_code == 404 else "that did not work"
    return await _error_page(request, error.status_code, message)


async def _error_page(request: Request, status: int, message: str) -> Response:
    """error.html; with the request's session, whatever its role allows (the error may be that refusal), the
    signed-in admin's navigation and sign-out. A session that cannot be resumed shows the page as to a
    signed-out visitor, never a 500: the database or the gateway may be the very error shown."""
    context = {"status": status, "message": message}
    secret = request.cookies.get(session_cookie_name(request))
    if secret:
        try:
            panel = panel_of(request)
            user = await resume_session(panel.ctx, secret=secret)
            if user is not None:
                current = Visit(panel=panel, user=user)
                return await render(request, "error.html", context, current=current, status=status)
        except Exception as failure:
            logger.warning("error page shown without the session: %s", type(failure).__name__)
    return await render(request, "error.html", context, status=status)
