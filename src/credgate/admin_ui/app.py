"""create_panel(): the panel's Starlette app, its pages, static files and error pages."""

from collections.abc import Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from credgate.admin_ui import auth_pages, budget_pages, integration_pages, key_pages, project_pages, webhook_pages
from credgate.admin_ui.base import Panel, SignInRequired, render
from credgate.admin_ui.security import SecurityHeaders
from credgate.errors import ServiceError
from credgate.services.context import Context
from credgate.services.verification import KeyVerifier

HERE = Path(__file__).parent


def create_panel(get_context: Callable[[], Context], verify_key: KeyVerifier | None = None) -> SecurityHeaders:
    """The panel; `get_context` gives the services' context once the gateway has started, `verify_key` makes a
    key's verification call."""
    routes = [
        Route("/", lambda request: RedirectResponse("/admin/projects", status_code=303)),
        *auth_pages.routes,
        *project_pages.routes,
        *integration_pages.routes,
        *key_pages.routes,
        *budget_pages.routes,
        *webhook_pages.routes,
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            SignInRequired: _sign_in,
            ServiceError: _service_error,
            HTTPException: _http_error,
        },
    )
    app.state.panel = Panel(get_context, verify_key)
    return SecurityHeaders(app)


async def _sign_in(request: Request, _error: Exception) -> Response:
    return RedirectResponse("/admin/login", status_code=303)


async def _service_error(request: Request, error: Exception) -> Response:
    if not isinstance(error, ServiceError):
        raise error
    return await render(request, "error.html", {"status": error.status, "message": error.message}, status=error.status)


async def _http_error(request: Request, error: Exception) -> Response:
    if not isinstance(error, HTTPException):
        raise error
    message = "page not found" if error.status_code == 404 else "that did not work"
    return await render(
        request, "error.html", {"status": error.status_code, "message": message}, status=error.status_code
    )
