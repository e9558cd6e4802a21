"""A stand-in OpenID Connect provider on a real socket, for the panel's single sign-on: discovery, an authorize
endpoint that signs in `account` at once (no login page: the tests are about the gateway's side), a token
endpoint that checks the client's secret, the code, its redirect URI and the PKCE verifier, and a JWKS. It
records what it received, and `misbehave` makes it answer wrongly in one named way."""

import base64
import functools
import hashlib
import html
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import jwt
from aiohttp import web

from tests.e2e.test_identity_tokens import SigningKey, rsa_key

CLIENT_ID = "credgate-panel"
CLIENT_SECRET = "sso-client-secret-0123456789abcdef"


@functools.cache
def _provider_key() -> SigningKey:
    return rsa_key("sso-1")  # one per test process: an RSA key takes a tenth of a second to make


@dataclass
class Account:
    sub: str = "idp-user-1"
    email: str = "alice@example.com"
    email_verified: bool = True


@dataclass
class _Grant:
    redirect_uri: str
    challenge: str
    nonce: str
    account: Account
    auth_time: float


@dataclass
class OidcProvider:
    url: str = ""
    key: SigningKey = field(default_factory=lambda: _provider_key())
    account: Account = field(default_factory=Account)
    # One of: "" (behave), "wrong-nonce", "wrong-audience", "audience-only-in-azp", "expired", "foreign-key",
    # "other-issuer", "not-json-discovery", "discovery-without-endpoints", "deny", "keeps-its-session" (ignores
    # `prompt=login` and `max_age`: the account stays signed in since `signed_in_at`).
    misbehave: str = ""
    signed_in_at: float | None = None  # the provider's own session: when the account last typed its password
    # A page with a Continue link rather than a redirect, as a real provider's sign-in form: what the browser
    # does next starts on the provider's site.
    consent_page: bool = False
    authorize_requests: list[dict[str, str]] = field(default_factory=list)
    token_requests: list[dict[str, str]] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    _grants: dict[str, _Grant] = field(default_factory=dict)

    def id_token(self, grant: _Grant) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.url,
            "sub": grant.account.sub,
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": grant.nonce,
            "email": grant.account.email,
            "email_verified": grant.account.email_verified,
            "auth_time": int(grant.auth_time),
        }
        key = self.key
        match self.misbehave:
            case "wrong-nonce":
                claims["nonce"] = "not-the-one-sent"
            case "wrong-audience":
                claims["aud"] = "another-client"
            case "audience-only-in-azp":
                claims |= {"aud": "another-client", "azp": CLIENT_ID}
            case "expired":
                claims |= {"iat": now - 3600, "exp": now - 600}
            case "foreign-key":
                key = rsa_key("sso-1")  # the published kid, another key: the signature cannot verify
        return jwt.encode(claims, key.private, algorithm=key.algorithm, headers={"kid": key.kid})


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


def _build_app(state: OidcProvider) -> web.Application:
    async def discovery(request: web.Request) -> web.Response:
        if state.misbehave == "not-json-discovery":
            return web.Response(text="<html>maintenance</html>", content_type="text/html")
        if state.misbehave == "discovery-without-endpoints":
            return web.json_response({"issuer": state.url})
        issuer = "https://impostor.example" if state.misbehave == "other-issuer" else state.url
        return web.json_response(
            {
                "issuer": issuer,
                "authorization_endpoint": f"{state.url}/authorize",
                "token_endpoint": f"{state.url}/token",
                "jwks_uri": f"{state.url}/jwks",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256", "HS256", "none"],
                "code_challenge_methods_supported": ["S256"],
            }
        )

    async def authorize(request: web.Request) -> web.Response:
        query = dict(request.query)
        state.authorize_requests.append(query)
        redirect_uri = query.get("redirect_uri", "")
        if state.misbehave == "deny":
            denied = {"error": "access_denied", "state": query.get("state", "")}
            raise web.HTTPFound(f"{redirect_uri}?{urlencode(denied)}")
        if query.get("client_id") != CLIENT_ID or query.get("code_challenge_method") != "S256":
            state.refusals.append("authorize: client or PKCE method")
            raise web.HTTPBadRequest(text="bad authorization request")
        again = query.get("prompt") == "login" or query.get("max_age") == "0"
        if state.signed_in_at is None or (again and state.misbehave != "keeps-its-session"):
            state.signed_in_at = time.time()  # the account signs in at the provider
        code = secrets.token_urlsafe(16)
        grant = _Grant(redirect_uri, query["code_challenge"], query.get("nonce", ""), state.account, state.signed_in_at)
        state._grants[code] = grant
        back = f"{redirect_uri}?{urlencode({'code': code, 'state': query.get('state', '')})}"
        if state.consent_page:
            page = f'<!doctype html><title>Provider</title><a href="{html.escape(back)}">Continue</a>'
            return web.Response(text=page, content_type="text/html")
        raise web.HTTPFound(back)

    async def token(request: web.Request) -> web.Response:
        form = dict(await request.post())
        state.token_requests.append({name: str(value) for name, value in form.items()})
        expected = "Basic " + base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        grant = state._grants.pop(str(form.get("code", "")), None)  # a code works once
        problem = (
            "client authentication"
            if request.headers.get("Authorization") != expected
            else "unknown or used code"
            if grant is None
            else "redirect_uri"
            if form.get("redirect_uri") != grant.redirect_uri
            else "PKCE verifier"
            if _s256(str(form.get("code_verifier", ""))) != grant.challenge
            else ""
        )
        if problem or grant is None:
            state.refusals.append(f"token: {problem}")
            return web.json_response({"error": "invalid_grant"}, status=400)
        access = secrets.token_urlsafe(16)
        body = {"access_token": access, "token_type": "Bearer", "expires_in": 300, "id_token": state.id_token(grant)}
        return web.json_response(body)

    async def jwks(request: web.Request) -> web.Response:
        return web.json_response({"keys": [state.key.public_jwk()]})

    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", discovery)
    app.router.add_get("/authorize", authorize)
    app.router.add_post("/token", token)
    app.router.add_get("/jwks", jwks)
    return app


@asynccontextmanager
async def run_oidc_provider(host: str = "127.0.0.1") -> AsyncIterator[OidcProvider]:
    """On loopback; `host` is the name in its URLs ("localhost" makes it another site than 127.0.0.1 for a
    browser's SameSite rules, as a real provider is)."""
    state = OidcProvider()
    runner = web.AppRunner(_build_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://{host}:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        await runner.cleanup()
