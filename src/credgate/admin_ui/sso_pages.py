"""Single sign-on to the panel through an OpenID Connect provider: Authorization Code with PKCE and a nonce,
done by authlib. What the flow must remember between the two legs (state, PKCE verifier, nonce) travels in a
cookie sealed with the master key, so the browser may come back to any worker or instance of the fleet."""

import base64
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from credgate.admin_ui.base import Panel, panel_of, render, visit
from credgate.admin_ui.security import cookie_options, panel_path, session_cookie_name
from credgate.config import Settings
from credgate.crypto import DecryptionError
from credgate.errors import NotFound, Unauthorized
from credgate.services import admins, panel_sessions

if TYPE_CHECKING:
    from authlib.integrations.starlette_client import StarletteOAuth2App

STATE_COOKIE = "credgate_sso"
_STATE_PATH = "/admin/sso"
_STATE_SECONDS = 600  # time to sign in at the provider
_STATE_BINDING = b"credgate/v1 sso state"
# ID tokens are taken only signed with the provider's published public keys, whatever its discovery says.
_SIGNING_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
_LEEWAY_SECONDS = 30
_CONFIRMING = "credgate_confirming"  # in a flow's state: the session a sign-in confirms, when, and where next
_METADATA_SECONDS = 3600  # discovery document and keys, read again after this
# The error codes of RFC 6749 §4.1.2.1 and §5.2 and OpenID Connect Core §3.1.2.6, the only ones shown.
_KNOWN_ERRORS = frozenset(
    {
        "access_denied",
        "invalid_request",
        "unauthorized_client",
        "unsupported_response_type",
        "invalid_scope",
        "server_error",
        "temporarily_unavailable",
        "invalid_client",
        "invalid_grant",
        "unsupported_grant_type",
        "interaction_required",
        "login_required",
        "account_selection_required",
        "consent_required",
    }
)


@dataclass(frozen=True, slots=True)
class SingleSignOn:
    """The settings of the panel's sign-in through an OpenID Connect provider (README, Single sign-on)."""

    issuer: str
    client_id: str
    client_secret: str | None = field(repr=False)
    new_users: str
    email_domains: frozenset[str]
    name: str

    @classmethod
    def of(cls, settings: Settings) -> "SingleSignOn | None":
        if settings.oidc_issuer is None or settings.oidc_client_id is None:
            return None
        secret = settings.oidc_client_secret
        return cls(
            issuer=settings.oidc_issuer.rstrip("/"),
            client_id=settings.oidc_client_id,
            client_secret=None if secret is None else secret.get_secret_value(),
            new_users=settings.oidc_new_users,
            email_domains=settings.oidc_email_domain_set,
            name=settings.oidc_name,
        )


class SingleSignOnFailed(Exception):
    """The provider's answer was refused; the message says why, in words for the sign-in page."""


def _provider(panel: Panel) -> tuple[SingleSignOn, "StarletteOAuth2App"]:
    """The settings and the provider's client, made at the first sign-in: authlib is loaded only where single
    sign-on is used."""
    sso = panel.sso
    if sso is None:
        raise NotFound("single sign-on is not set up on this gateway")
    if panel.sso_client is None:
        from authlib.integrations.starlette_client import OAuth

        # Its debug lines name the PKCE verifier; nothing of a sign-in's secrets belongs in the log.
        logging.getLogger("authlib").setLevel(max(logging.INFO, logging.getLogger().getEffectiveLevel()))

        panel.sso_client = OAuth().register(
            "provider",
            client_id=sso.client_id,
            client_secret=sso.client_secret,
            server_metadata_url=f"{sso.issuer}/.well-known/openid-configuration",
            client_kwargs={
                "scope": "openid email profile",
                "code_challenge_method": "S256",
                "token_endpoint_auth_method": "client_secret_basic" if sso.client_secret else "none",
                "timeout": 10,
            },
        )
    client: StarletteOAuth2App = panel.sso_client
    return sso, client


async def _checked_metadata(sso: SingleSignOn, client: "StarletteOAuth2App") -> None:
    """The discovery document must name the configured issuer (OpenID Connect Discovery §4.3), and ID tokens
    are verified with public-key algorithms only."""
    metadata = await client.load_server_metadata()
    if str(metadata.get("issuer", "")).rstrip("/") != sso.issuer:
        raise SingleSignOnFailed("the identity provider's discovery document names another issuer")
    advertised = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
    metadata["id_token_signing_alg_values_supported"] = [alg for alg in advertised if alg in _SIGNING_ALGORITHMS]


def _now() -> float:
    return time.time()  # a name of this module's own, for the tests' clock


def _flow_cookie(request: Request, state: str) -> tuple[str, str]:
    """The name and path of one flow's cookie: one per flow, so a sign-in started in another tab does not
    replace it; `__Host-` over HTTPS binds it to this exact origin (which requires the path `/`)."""
    name = f"{STATE_COOKIE}_{hashlib.sha256(state.encode()).hexdigest()[:16]}"
    return (f"__Host-{name}", "/") if request.url.scheme == "https" else (name, _STATE_PATH)


def _sealed(panel: Panel, flow: dict[str, Any]) -> str:
    sealed = json.dumps({"at": _now(), "flow": flow}).encode()
    return base64.urlsafe_b64encode(panel.ctx.keyring.seal(sealed, aad=_STATE_BINDING)).decode()


def _opened(panel: Panel, cookie: str | None) -> dict[str, Any] | None:
    """The flow's state from its cookie; None when it is missing, altered, sealed by no key we hold, or older
    than the time a sign-in may take (authlib keeps an expiry in it but does not check it)."""
    if not cookie:
        return None
    try:
        sealed = json.loads(panel.ctx.keyring.open(base64.urlsafe_b64decode(cookie), aad=_STATE_BINDING))
        fresh = 0 <= _now() - float(sealed["at"]) <= _STATE_SECONDS
        flow = sealed["flow"]
    except (ValueError, TypeError, KeyError, DecryptionError):
        return None
    return flow if fresh and isinstance(flow, dict) else None


def _callback_url(request: Request) -> str:
    # The address the provider must have registered for this client (README, Single sign-on).
    return f"{request.url.scheme}://{request.url.netloc}{_STATE_PATH}/callback"


async def start(request: Request) -> Response:
    """Send the browser to the provider, remembering state, PKCE verifier and nonce in the flow's cookie.

    With `confirm`, a signed-in user confirms who they are (confirm_pages): the provider is asked to sign them
    in again rather than rely on its own session (OpenID Connect Core 3.1.2.1, `prompt` and `max_age`), and the
    callback checks that it did."""
    panel = panel_of(request)
    sso, client = _provider(panel)
    request.scope["session"] = {}  # authlib keeps the flow's state here
    again: dict[str, Any] = {}
    if request.query_params.get("confirm"):
        current = await visit(request, changing=False)
        next_page = panel_path(request.query_params.get("next", ""))
        request.session[_CONFIRMING] = {"session": current.user.session_id, "since": _now(), "next": next_page}
        again = {"prompt": "login", "max_age": 0}
    try:
        async with _asking(client):
            await _checked_metadata(sso, client)
            response: Response = await client.authorize_redirect(request, _callback_url(request), **again)
    except SingleSignOnFailed as error:
        return await _refused(request, str(error))
    state = parse_qs(urlsplit(response.headers["location"]).query)["state"][0]
    name, path = _flow_cookie(request, state)
    options = cookie_options(request) | {"samesite": "lax", "path": path}  # lax: it comes back cross-site
    response.set_cookie(name, _sealed(panel, request.session), max_age=_STATE_SECONDS, **options)  # type: ignore[arg-type]
    return response


async def callback(request: Request) -> Response:
    """Take the provider's code (with the PKCE verifier), verify the ID token and open a panel session."""
    panel = panel_of(request)
    sso, client = _provider(panel)
    state = request.query_params.get("state", "")
    name, path = _flow_cookie(request, state)
    flow = _opened(panel, request.cookies.get(name))
    # Nothing the link says is believed, its error included, before it is known to answer this browser's flow.
    if not state or flow is None or f"_state_provider_{state}" not in flow:
        return await _refused(request, "the sign-in took too long or was started in another browser; start it again")
    request.scope["session"] = flow
    try:
        async with _asking(client):
            await _checked_metadata(sso, client)
            # authlib checks the issuer and the client in `azp` only: the audience is asked for here.
            claims_options = {
                "iss": {"essential": True, "value": sso.issuer},
                "aud": {"essential": True, "value": sso.client_id},
            }
            token = await client.authorize_access_token(request, leeway=_LEEWAY_SECONDS, claims_options=claims_options)
        claims = token.get("userinfo") or {}
        email = claims.get("email")
        if not isinstance(email, str) or claims.get("email_verified") is not True:
            raise SingleSignOnFailed("the identity provider gave no verified email address")
        user = await admins.single_sign_on_user(
            panel.ctx,
            issuer=sso.issuer,
            subject=str(claims["sub"]),
            email=email,
            new_users=sso.new_users,
            new_user_domains=sso.email_domains,
        )
        auth_time = claims.get("auth_time")
        signed_in_at = float(auth_time) if isinstance(auth_time, int | float) else None
        confirming = flow.get(_CONFIRMING)
        if confirming is not None:
            if signed_in_at is None or signed_in_at < float(confirming["since"]) - _LEEWAY_SECONDS:
                raise SingleSignOnFailed("the identity provider did not sign you in again; nothing was confirmed")
            await panel_sessions.confirm_single_sign_on(panel.ctx, session_id=confirming["session"], user_id=user.id)
    except (SingleSignOnFailed, Unauthorized) as error:
        return await _refused(request, str(error), flow_cookie=(name, path))
    # Not a redirect: the session cookie is SameSite=Strict, and browsers withhold it from a redirect that
    # continues the provider's cross-site one. The page's own refresh is a same-site navigation.
    if confirming is not None:  # the session the browser holds is the one confirmed
        response = await render(request, "sso_done.html", {"next": confirming["next"], "confirmed": True})
    else:
        # Signed in through the provider's own session, the user proved who they are when they opened it.
        age = timedelta(seconds=max(0.0, _now() - signed_in_at)) if signed_in_at is not None else timedelta()
        opened = panel.ctx.clock() - age
        secret, _ = await panel_sessions.open_session(panel.ctx, user, via="single sign-on", authenticated_at=opened)
        response = await render(request, "sso_done.html", {"next": "/admin/projects", "confirmed": False})
        response.set_cookie(session_cookie_name(request), secret, **cookie_options(request))  # type: ignore[arg-type]
    response.delete_cookie(name, path=path)
    return response


@contextlib.asynccontextmanager
async def _asking(client: "StarletteOAuth2App") -> AsyncIterator[None]:
    """Around calls to the provider: what it does wrong (a refusal, a bad token, no answer, a discovery document
    that is not one) becomes SingleSignOnFailed in words, and its documents are read again at the next sign-in."""
    import httpx
    from authlib.common.errors import AuthlibBaseError
    from authlib.integrations.base_client import OAuthError
    from joserfc.errors import JoseError

    if time.time() - client.server_metadata.get("_loaded_at", 0) > _METADATA_SECONDS:
        client.server_metadata.clear()  # moved endpoints and retired keys are noticed within the hour
    try:
        yield
    except SingleSignOnFailed:
        client.server_metadata.clear()
        raise
    except OAuthError as error:
        client.server_metadata.clear()
        raise SingleSignOnFailed(_answered(error.error)) from None
    except (AuthlibBaseError, JoseError, httpx.HTTPError, ValueError, RuntimeError, KeyError):
        client.server_metadata.clear()
        raise SingleSignOnFailed("the identity provider's answer was refused") from None


def _answered(code: str | None) -> str:
    """The provider's error code, when it is one the standards define (a link may carry any text)."""
    if code in _KNOWN_ERRORS:
        return f"the identity provider answered {code}"  # such as access_denied, when the user declined
    return "the identity provider's answer was refused"


async def _refused(request: Request, reason: str, *, flow_cookie: tuple[str, str] | None = None) -> Response:
    context = {"status": 403, "message": f"Single sign-on did not work: {reason}.", "reason": "sso"}
    response = await render(request, "error.html", context, status=403)
    if flow_cookie is not None:  # only the flow this answer was for: another tab's goes on
        response.delete_cookie(flow_cookie[0], path=flow_cookie[1])
    return response


routes = [
    Route("/sso/start", start, methods=["GET"]),
    Route("/sso/callback", callback, methods=["GET"], name="sso_callback"),
]
