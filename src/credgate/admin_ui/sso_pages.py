"""Single sign-on to the panel through an OpenID Connect provider: Authorization Code with PKCE and a nonce,
done by authlib. What the flow must remember between the two legs (state, PKCE verifier, nonce) travels in a
cookie sealed with the master key, so the browser may come back to any worker or instance of the fleet."""

import base64
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from credgate.admin_ui.base import Panel, panel_of, render
from credgate.admin_ui.security import cookie_options, session_cookie_name
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


@dataclass(frozen=True, slots=True)
class SingleSignOn:
    """The settings of the panel's sign-in through an OpenID Connect provider (README, Single sign-on)."""

    issuer: str
    client_id: str
    client_secret: str | None
    new_users: str
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


def _sealed(panel: Panel, state: dict[str, Any]) -> str:
    blob = panel.ctx.keyring.seal(json.dumps(state).encode(), aad=_STATE_BINDING)
    return base64.urlsafe_b64encode(blob).decode()


def _opened(panel: Panel, cookie: str | None) -> dict[str, Any]:
    """The flow's state from its cookie; nothing when it is missing, altered or sealed by no key we hold."""
    if not cookie:
        return {}
    try:
        state = json.loads(panel.ctx.keyring.open(base64.urlsafe_b64decode(cookie), aad=_STATE_BINDING))
    except (ValueError, DecryptionError):
        return {}
    return state if isinstance(state, dict) else {}


def _callback_url(request: Request) -> str:
    # The address the provider must have registered for this client (README, Single sign-on).
    return f"{request.url.scheme}://{request.url.netloc}{_STATE_PATH}/callback"


async def start(request: Request) -> Response:
    """Send the browser to the provider, remembering state, PKCE verifier and nonce in the sealed cookie."""
    panel = panel_of(request)
    sso, client = _provider(panel)
    request.scope["session"] = {}  # authlib keeps the flow's state here
    try:
        await _checked_metadata(sso, client)
        response: Response = await client.authorize_redirect(request, _callback_url(request))
    except SingleSignOnFailed as error:
        return await _refused(request, str(error))
    except Exception as error:  # the provider could not be reached or answered nonsense
        if not _provider_error(error):
            raise
        return await _refused(request, "the identity provider could not be reached")
    options = cookie_options(request) | {"samesite": "lax", "path": _STATE_PATH}  # lax: it comes back cross-site
    response.set_cookie(STATE_COOKIE, _sealed(panel, request.session), max_age=_STATE_SECONDS, **options)  # type: ignore[arg-type]
    return response


async def callback(request: Request) -> Response:
    """Take the provider's code (with the PKCE verifier), verify the ID token and open a panel session."""
    panel = panel_of(request)
    sso, client = _provider(panel)
    request.scope["session"] = _opened(panel, request.cookies.get(STATE_COOKIE))
    try:
        await _checked_metadata(sso, client)
        token = await client.authorize_access_token(request, leeway=_LEEWAY_SECONDS)
        claims = token.get("userinfo") or {}
        email = claims.get("email")
        if not isinstance(email, str) or claims.get("email_verified") is not True:
            raise SingleSignOnFailed("the identity provider gave no verified email address")
        user = await admins.single_sign_on_user(
            panel.ctx, issuer=sso.issuer, subject=str(claims["sub"]), email=email, new_users=sso.new_users
        )
    except (SingleSignOnFailed, Unauthorized) as error:
        return await _refused(request, str(error))
    except Exception as error:
        if not _provider_error(error):
            raise
        return await _refused(request, _provider_reason(error))
    secret, _ = await panel_sessions.open_session(panel.ctx, user, via="single sign-on")
    # Not a redirect: the session cookie is SameSite=Strict, and browsers withhold it from a redirect that
    # continues the provider's cross-site one. The page's own refresh is a same-site navigation.
    response = await render(request, "sso_done.html", {})
    response.set_cookie(session_cookie_name(request), secret, **cookie_options(request))  # type: ignore[arg-type]
    response.delete_cookie(STATE_COOKIE, path=_STATE_PATH)
    return response


def _provider_error(error: Exception) -> bool:
    """Whether `error` is the provider's doing (a refusal, a bad token, no answer), not a bug of ours."""
    import httpx
    from authlib.common.errors import AuthlibBaseError
    from joserfc.errors import JoseError

    return isinstance(error, AuthlibBaseError | JoseError | httpx.HTTPError)


def _provider_reason(error: Exception) -> str:
    from authlib.integrations.base_client import MismatchingStateError, OAuthError

    if isinstance(error, MismatchingStateError):
        return "the sign-in took too long or was started in another browser; start it again"
    if isinstance(error, OAuthError) and error.error:
        return f"the identity provider answered {error.error}"  # such as access_denied, when the user declined
    return "the identity provider's answer was refused"


async def _refused(request: Request, reason: str) -> Response:
    context = {"status": 403, "message": f"Single sign-on did not work: {reason}.", "reason": "sso"}
    response = await render(request, "error.html", context, status=403)
    response.delete_cookie(STATE_COOKIE, path=_STATE_PATH)
    return response


routes = [
    Route("/sso/start", start, methods=["GET"]),
    Route("/sso/callback", callback, methods=["GET"], name="sso_callback"),
]
