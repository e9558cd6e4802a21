"""What every panel page shares: the Panel (services, sign-in throttle), sign-in checks, forms and rendering."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from credgate import limits
from credgate.admin_ui.security import SignInThrottle, check_csrf, check_origin, session_cookie_name
from credgate.errors import InvalidInput
from credgate.key_shapes import KEY_SHAPES
from credgate.roles import Principal
from credgate.services.context import Context
from credgate.services.panel_sessions import SignedIn, resume_session
from credgate.services.panel_state import flash_message, take_flash
from credgate.services.verification import KeyVerifier

if TYPE_CHECKING:
    from credgate.admin_ui.sso_pages import SingleSignOn

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
templates.env.globals["limits"] = limits  # the pages' maxlength and hints, from the one definition
templates.env.globals["key_shapes"] = KEY_SHAPES


class SignInRequired(Exception):
    """The page needs a signed-in admin."""


class RecentSignInRequired(Exception):
    """The page hands out or takes away a credential, and the user has not proved who they are recently."""


class Panel:
    def __init__(
        self,
        get_context: Callable[[], Context],
        verify_key: KeyVerifier | None = None,
        sso: "SingleSignOn | None" = None,
    ) -> None:
        self._get_context = get_context
        self.verify_key = verify_key  # the running gateway's: a key's check is a call like any proxied one
        self.throttle = SignInThrottle()
        self.sso = sso
        self.sso_client: Any = None  # authlib's client for `sso`, made at its first use (sso_pages)

    @property
    def ctx(self) -> Context:
        return self._get_context()


@dataclass(frozen=True, slots=True)
class Visit:
    """A signed-in request: the panel, the admin, and the audit actor name."""

    panel: Panel
    user: SignedIn

    @property
    def ctx(self) -> Context:
        return self.panel.ctx

    @property
    def actor(self) -> str:
        return f"user:{self.user.username}"

    @property
    def principal(self) -> Principal:
        return Principal.of(actor=self.actor, role=self.user.role, project_ids=self.user.project_ids, kind="user")

    def require_recent_sign_in(self) -> None:
        if not self.user.signed_in_recently(self.ctx.clock()):
            raise RecentSignInRequired

    async def flash(self, message: str, *, secret: str | None = None) -> None:
        """Show `message` (and the one-time `secret`) on this session's next page, whichever process serves it."""
        await flash_message(self.ctx, session_id=self.user.session_id, message=message, secret=secret)


def panel_of(request: Request) -> Panel:
    panel: Panel = request.app.state.panel
    return panel


async def visit(request: Request, *, changing: bool | None = None, sensitive: bool = False) -> Visit:
    """The signed-in admin of this request, or SignInRequired; and Forbidden unless its role allows the page.

    Every page checks here, by its project and whether it changes something (a POST does; a form's page says
    so): a project's page needs `may_read`, a change `may_change`; a change that names no project is the owner's.
    A `sensitive` page (a credential handed out or taken away) also needs a recent sign-in (confirm_pages).
    """
    panel = panel_of(request)
    secret = request.cookies.get(session_cookie_name(request))
    user = await resume_session(panel.ctx, secret=secret) if secret else None
    if user is None:
        raise SignInRequired
    current = Visit(panel=panel, user=user)
    changing = request.method not in ("GET", "HEAD") if changing is None else changing
    project_id = request.path_params.get("project_id")
    if project_id is not None:
        (current.principal.require_change if changing else current.principal.require_read)(project_id)
    elif changing:
        current.principal.require_owner(f"{request.method} {request.url.path}")
    if sensitive:
        current.require_recent_sign_in()
    return current


async def form_of(request: Request, current: Visit) -> FormData:
    """The posted form, once its origin and CSRF token are checked."""
    check_origin(request)
    form = await request.form()
    check_csrf(form, current.user.csrf_token)
    return form


def field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def field_error(error: InvalidInput) -> dict[str, str]:
    """The service's refusal as the page shows it, next to the field it names: "Must be a whole number …"."""
    return {error.field: f"{error.problem[:1].upper()}{error.problem[1:]}."}


async def render(
    request: Request, page: str, context: dict[str, Any], *, current: Visit | None = None, status: int = 200
) -> Response:
    values: dict[str, Any] = {"request": request, "user": None, "csrf": "", "messages": [], **context}
    if current is not None:
        flash = await take_flash(current.ctx, session_id=current.user.session_id)
        values |= {"user": current.user, "csrf": current.user.csrf_token, "messages": flash.messages}
        # What the role allows on this page: its forms, and links to forms, show only then (credgate.roles).
        project_id = request.path_params.get("project_id")
        principal = current.principal
        may_change = principal.may_change(project_id) if project_id else principal.may_administer()
        values |= {"principal": principal, "may_change": may_change, "may_administer": principal.may_administer()}
        values.setdefault("secret", flash.secret)
    return templates.TemplateResponse(request, page, values, status_code=status)


def redirect(url: str) -> Response:
    return RedirectResponse(url, status_code=303)
