"""OAuth 2.0 access tokens for upstreams: fetched from the token endpoint, cached until shortly before they
expire, fetched once however many requests need one at the same moment, and never logged.

The grants: client credentials, refresh token, and the JWT bearer grant (RFC 7523) of a Google service
account, whose assertion is signed here with the account's private key (the key itself never leaves)."""

import asyncio
import base64
import hashlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from yarl import URL

from credgate import metrics
from credgate.crypto import Secret
from credgate.errors import BadGateway
from credgate.key_shapes import service_account_info
from credgate.proxy.guard import NonPublicAddress
from credgate.proxy.upstreams import Upstreams
from credgate.resolved import ResolvedIntegration
from credgate.specs import GoogleServiceAccountAuth, OAuth2ClientCredentialsAuth, OAuth2RefreshTokenAuth

logger = logging.getLogger(__name__)
DEFAULT_LIFETIME_SECONDS = 3600.0
MAX_LIFETIME_SECONDS = 7 * 24 * 3600.0  # a week: longer claims are renewed anyway
_RENEW_BEFORE_SECONDS = 60.0
_FAILURE_PAUSE_SECONDS = 2.0  # after a failed fetch, so a broken endpoint is not hammered by every request
_FETCH_TIMEOUT_SECONDS = 30
_MAX_ANSWER_BYTES = 1 << 20  # a token endpoint's answer: a few hundred bytes
_ASSERTION_LIFETIME_SECONDS = 3600  # the longest Google accepts
JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TokenSpec = OAuth2ClientCredentialsAuth | OAuth2RefreshTokenAuth | GoogleServiceAccountAuth
RefreshTokenSink = Callable[[str, str, str], Awaitable[None]]  # (project id, provider, new refresh token)


@dataclass(slots=True)
class _Cached:
    access_token: Secret
    renew_at: float


class TokenBroker:
    def __init__(
        self,
        upstreams: Upstreams,
        *,
        store_refresh_token: RefreshTokenSink,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._upstreams = upstreams  # the token endpoint is reached within the integration's exceptions too
        self._store_refresh_token = store_refresh_token
        self._clock = clock
        self._tokens: dict[tuple[object, ...], _Cached] = {}
        self._fetching: dict[tuple[object, ...], asyncio.Future[_Cached]] = {}
        self._failed_until: dict[tuple[object, ...], tuple[float, BadGateway]] = {}

    async def access_token(self, *, project_id: str, integration: ResolvedIntegration, secret: Secret) -> Secret:
        """A valid access token for this integration (BadGateway, with no secret in it, when none can be had)."""
        key = (project_id, integration.provider, integration.auth, hashlib.sha256(secret.reveal().encode()).digest())
        now = self._clock()
        cached = self._tokens.get(key)
        if cached is not None and now < cached.renew_at:
            return cached.access_token
        failed = self._failed_until.get(key)
        if failed is not None and now < failed[0]:
            raise failed[1]
        pending = self._fetching.get(key)
        if pending is None:
            # A task of its own, not the first request's: were that request's client to leave mid-fetch, its
            # cancellation would otherwise leave every request waiting on the same fetch waiting for ever.
            pending = asyncio.ensure_future(self._fetch_into_cache(key, project_id, integration, secret))
            self._fetching[key] = pending
            pending.add_done_callback(_retrieve)
        return (await asyncio.shield(pending)).access_token

    async def _fetch_into_cache(
        self, key: tuple[object, ...], project_id: str, integration: ResolvedIntegration, secret: Secret
    ) -> _Cached:
        try:
            fetched = await self._fetch(project_id, integration, secret)
        except BadGateway as error:
            self._failed_until[key] = (self._clock() + _FAILURE_PAUSE_SECONDS, error)
            metrics.oauth_token_fetches.labels(integration.provider, "failed").inc()
            raise
        finally:
            del self._fetching[key]
        metrics.oauth_token_fetches.labels(integration.provider, "ok").inc()
        self._tokens[key] = fetched
        self._failed_until.pop(key, None)
        return fetched

    async def _fetch(self, project_id: str, integration: ResolvedIntegration, secret: Secret) -> _Cached:
        spec = integration.auth
        if not isinstance(spec, TokenSpec):
            raise TypeError("not an OAuth 2.0 integration")
        provider = integration.provider
        if self._upstreams.refuses(spec.token_url, integration.private_networks):
            raise BadGateway(f"{provider}: the token endpoint's address is not public; refused")
        port = self._upstreams.refused_port(spec.token_url, integration.private_networks)
        if port is not None:
            raise BadGateway(f"{provider}: the token endpoint's port {port} is not in CREDGATE_UPSTREAM_PORTS; refused")
        if isinstance(spec, GoogleServiceAccountAuth):
            # Loading an RSA key and signing take milliseconds of CPU: off the event loop.
            assertion = await asyncio.to_thread(_service_account_assertion, spec, secret, time.time())
            if assertion is None:
                raise BadGateway(
                    f"{provider}: the stored key is not a usable Google service-account JSON key file; "
                    "set the key again (PUT …/key)"
                )
            form, headers = _jwt_bearer_request(assertion)
        else:
            form, headers = _token_request(spec, secret)
        pool = self._upstreams.own_calls_for(integration.private_networks)
        try:
            async with asyncio.timeout(_FETCH_TIMEOUT_SECONDS):
                status, body = await pool.fetch(
                    "POST", URL(spec.token_url), headers, urlencode(form).encode(), limit=_MAX_ANSWER_BYTES
                )
        except NonPublicAddress:
            raise BadGateway(f"{provider}: the token endpoint's address is not public; refused") from None
        except (OSError, ValueError) as error:  # TimeoutError among them
            logger.warning("token endpoint of %s unreachable: %s", provider, type(error).__name__)
            raise BadGateway(f"{provider}: the token endpoint could not be reached") from None
        if status != 200:
            raise BadGateway(f"{provider}: the token endpoint refused the credentials (status {status})")
        try:
            document = json.loads(body)
            access_token = document["access_token"]
            lifetime = _lifetime(document.get("expires_in"))
        except (ValueError, KeyError, TypeError):
            raise BadGateway(f"{provider}: the token endpoint's answer holds no access token") from None
        if not isinstance(access_token, str) or not access_token:
            raise BadGateway(f"{provider}: the token endpoint's answer holds no access token")
        new_refresh = document.get("refresh_token")
        if isinstance(spec, OAuth2RefreshTokenAuth) and isinstance(new_refresh, str) and new_refresh != secret.reveal():
            await self._store_refresh_token(project_id, provider, new_refresh)
        renew_before = min(_RENEW_BEFORE_SECONDS, lifetime / 2)
        return _Cached(access_token=Secret(access_token), renew_at=self._clock() + lifetime - renew_before)


def _retrieve(fetch: asyncio.Future[_Cached]) -> None:
    """A failure no request awaits any more (all of them left) is not reported as never retrieved."""
    if not fetch.cancelled():
        fetch.exception()


def _lifetime(expires_in: object) -> float:
    """The token's lifetime in seconds (RFC 6749 section 5.1): absent means the default, and 0 means it is good
    for this request only, never "absent"; nonsense is not trusted for longer than the default either."""
    if expires_in is None:
        return DEFAULT_LIFETIME_SECONDS
    if not isinstance(expires_in, int | float | str):
        raise TypeError("expires_in is not a number")  # a malformed answer, like a ValueError from float()
    lifetime = float(expires_in)
    return min(max(lifetime, 0.0), MAX_LIFETIME_SECONDS) if math.isfinite(lifetime) else DEFAULT_LIFETIME_SECONDS


def _form_headers() -> list[tuple[str, str]]:
    # The upstream client adds no header of its own but Host and the body's length: say the rest here.
    return [("Accept", "application/json"), ("Content-Type", "application/x-www-form-urlencoded")]


def _service_account_assertion(spec: GoogleServiceAccountAuth, secret: Secret, now: float) -> str | None:
    """The signed JWT (RFC 7523 section 2.1) Google trades for an access token, or None when the stored key is
    not a usable service-account key file (the reason is not kept: it could quote part of the key)."""
    # Imported here: google-auth weighs about 20 MB in every worker, and few gateways hold a service account.
    from google.auth import crypt, jwt

    try:
        info = service_account_info(secret.reveal())
        # google-auth's functions carry no annotations; their documented types are the ones given here.
        signer: crypt.Signer = crypt.RSASigner.from_service_account_info(info)  # type: ignore[no-untyped-call]
        issued_at = int(now)
        payload = {
            "iss": info["client_email"],
            "scope": spec.scope,
            "aud": spec.token_url,
            "iat": issued_at,
            "exp": issued_at + _ASSERTION_LIFETIME_SECONDS,
        }
        # An EC or Ed25519 key loads, then fails to sign with TypeError; a malformed PEM gives ValueError.
        assertion: bytes = jwt.encode(signer, payload)  # type: ignore[no-untyped-call]  # kid: private_key_id
    except (ValueError, TypeError):
        return None
    return assertion.decode("ascii")


def _jwt_bearer_request(assertion: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The JWT bearer grant's form and headers (RFC 7523 section 2.1)."""
    return {"grant_type": JWT_BEARER_GRANT, "assertion": assertion}, _form_headers()


def _token_request(
    spec: OAuth2ClientCredentialsAuth | OAuth2RefreshTokenAuth, secret: Secret
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The token request's form and headers (RFC 6749 sections 4.4.2, 6 and 2.3.1)."""
    headers = _form_headers()
    if isinstance(spec, OAuth2RefreshTokenAuth):
        form = {"grant_type": "refresh_token", "refresh_token": secret.reveal(), "client_id": spec.client_id}
    else:
        form = {"grant_type": "client_credentials"}
        if spec.client_auth == "basic":
            pair = f"{quote(spec.client_id, safe='')}:{quote(secret.reveal(), safe='')}"
            headers.append(("Authorization", "Basic " + base64.b64encode(pair.encode()).decode()))
        else:
            form |= {"client_id": spec.client_id, "client_secret": secret.reveal()}
        if spec.audience:
            form["audience"] = spec.audience
    if spec.scope:
        form["scope"] = spec.scope
    return form, headers
