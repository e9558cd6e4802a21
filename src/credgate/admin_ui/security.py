"""The panel's defences: session cookie, CSRF (session token + Origin check), security headers, and a
growing wait after repeated failed sign-ins."""

import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from credgate.errors import Forbidden

LOGIN_CSRF_COOKIE = "credgate_login_csrf"
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
        b"base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # "no-referrer" makes browsers send `Origin: null` on posts
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]
# Browsers ignore it over plain HTTP (RFC 6797), and a panel reached by http://localhost must stay reachable so;
# over HTTPS (or behind a trusted proxy that says so) it keeps them on HTTPS for a year. No includeSubDomains:
# other hosts of the domain are not ours to pin.
HSTS = (b"strict-transport-security", b"max-age=31536000")


def session_cookie_name(request: Request) -> str:
    # `__Host-` binds the cookie to this exact origin, but browsers only accept it with Secure, over HTTPS.
    return "__Host-credgate_session" if request.url.scheme == "https" else "credgate_session"


def cookie_options(request: Request) -> dict[str, object]:
    return {"httponly": True, "samesite": "strict", "secure": request.url.scheme == "https", "path": "/"}


def check_origin(request: Request) -> None:
    """A state-changing request must come from the panel's own pages (when the browser says where from)."""
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        raise Forbidden("cross-site request refused")


def panel_path(value: str) -> str:
    """`value` if it names a page of the panel (a path, with its query), else the projects list: where a page
    may send the browser next, never another site."""
    parts = urlsplit(value)
    segments = parts.path.split("/")
    local = not (parts.scheme or parts.netloc) and parts.path.startswith("/admin/") and value.isprintable()
    # A backslash can stand for a slash, and `..` or an empty segment can climb or turn into `//host`.
    if local and "\\" not in value and "" not in segments[1:] and ".." not in segments and "." not in segments:
        return value
    return "/admin/projects"


def attempt_keys(request: Request, username: str) -> tuple[str, str]:
    """What failed password attempts are counted by: the username, and the client's address."""
    return f"user:{username.lower()}", f"address:{request.client.host if request.client else '?'}"


def check_csrf(form: FormData, expected: str) -> None:
    submitted = form.get("csrf")
    if not isinstance(submitted, str) or not hmac.compare_digest(submitted.encode(), expected.encode()):
        raise Forbidden("the form has expired or did not come from this panel; reload the page and try again")


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


class SecurityHeaders:
    """Adds the panel's security headers to every response it sends, HSTS too when it is served over HTTPS."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        added = [*SECURITY_HEADERS, HSTS] if scope.get("scheme") == "https" else SECURITY_HEADERS

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *added]
            await send(message)

        await self.app(scope, receive, send_with_headers)


@dataclass(slots=True)
class _Failures:
    count: int = 0
    blocked_until: float = 0.0


class SignInThrottle:
    """After `free` failures for a username or an address, each further attempt waits twice as long as the
    last (capped), so guessing passwords is slow while a typo costs nothing."""

    def __init__(self, *, free: int = 5, cap_seconds: float = 900, max_keys: int = 10_000) -> None:
        self._free = free
        self._cap = cap_seconds
        self._max_keys = max_keys
        self._failures: dict[str, _Failures] = {}

    def wait_seconds(self, *keys: str, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        return max((self._failures[key].blocked_until - now for key in keys if key in self._failures), default=0.0)

    def failed(self, *keys: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if len(self._failures) >= self._max_keys:
            self._failures.clear()
        for key in keys:
            failures = self._failures.setdefault(key, _Failures())
            failures.count += 1
            if failures.count > self._free:
                failures.blocked_until = now + min(self._cap, 2.0 ** (failures.count - self._free))

    def succeeded(self, *keys: str) -> None:
        for key in keys:
            self._failures.pop(key, None)
