"""End users' identity tokens on real sockets: a project trusts an identity provider, whose JWKS a local server
publishes; the proxy verifies RS256 and ES256 tokens against it (a rotated key included), refuses every bad one,
and records `sub` as the subject."""

import asyncio
import base64
import hmac
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from prometheus_client import REGISTRY

from credgate.errors import Conflict, InvalidInput
from credgate.services import projects, usage
from credgate.services.context import Context
from credgate.services.projects import ProjectChanges
from credgate.specs import IdentityProviderSpec
from tests.e2e.conftest import Project, add_project
from tests.upstream import Upstream

ISSUER = "https://auth.example/"
AUDIENCE = "chat-app"
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class SigningKey:
    kid: str
    algorithm: str
    private: Any

    def public_jwk(self) -> dict[str, Any]:
        codec = RSAAlgorithm if self.algorithm == "RS256" else ECAlgorithm
        jwk: dict[str, Any] = codec.to_jwk(self.private.public_key(), as_dict=True)
        return jwk | {"kid": self.kid, "alg": self.algorithm, "use": "sig"}

    def sign(self, **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "iat": now, "exp": now + 300} | claims
        return jwt.encode(
            {name: value for name, value in body.items() if value is not None},
            self.private,
            algorithm=self.algorithm,
            headers={"kid": self.kid},
        )


def rsa_key(kid: str) -> SigningKey:
    return SigningKey(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))


def ec_key(kid: str) -> SigningKey:
    return SigningKey(kid, "ES256", ec.generate_private_key(ec.SECP256R1()))


@dataclass
class IdentityServer:
    url: str = ""
    keys: list[SigningKey] = field(default_factory=list)
    fetches: int = 0

    @property
    def jwks_url(self) -> str:
        return f"{self.url}/.well-known/jwks.json"


@pytest.fixture
async def identity() -> AsyncIterator[IdentityServer]:
    state = IdentityServer(keys=[rsa_key("rsa-1"), ec_key("ec-1")])

    async def jwks(_request: web.Request) -> web.Response:
        state.fetches += 1
        return web.json_response({"keys": [key.public_jwk() for key in state.keys]})

    app = web.Application()
    app.router.add_get("/.well-known/jwks.json", jwks)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        yield state
    finally:
        await runner.cleanup()


async def trust(ctx: Context, project: Project, identity: IdentityServer, audience: str = AUDIENCE) -> None:
    provider = IdentityProviderSpec(jwks_url=identity.jwks_url, issuer=ISSUER, audience=audience)
    await projects.update_project(
        ctx, project_id=project.id, changes=ProjectChanges(identity_provider=provider), actor="t"
    )


async def chat(gateway_url: str, token: str, headers: Mapping[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
        return await client.post(
            "/proxy/openai/chat/completions", headers={"authorization": f"Bearer {token}", **(headers or {})}, json=CHAT
        )


@pytest.mark.parametrize("kid", ["rsa-1", "ec-1"])
async def test_an_end_users_token_reaches_the_provider_and_its_sub_is_recorded(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, identity: IdentityServer, kid: str
) -> None:
    await trust(ctx, project, identity)
    key = next(key for key in identity.keys if key.kid == kid)
    token = key.sign(sub="alice@example")

    response = await chat(gateway_url, token)

    assert response.status_code == 200
    assert upstream.last.header("authorization") == f"Bearer {project.key}"
    assert token not in str(upstream.last.headers)
    for _ in range(200):
        found = await usage.list_request_records(ctx, project_id=project.id)
        if found:
            break
        await asyncio.sleep(0.02)
    assert [record.subject for record in found] == ["alice@example"]


async def test_the_keys_are_fetched_once_and_cached(
    gateway_url: str, ctx: Context, project: Project, identity: IdentityServer
) -> None:
    await trust(ctx, project, identity)
    tokens = [identity.keys[0].sign(sub=f"user-{index}") for index in range(5)]
    answers = await asyncio.gather(*(chat(gateway_url, token) for token in tokens))
    assert [answer.status_code for answer in answers] == [200] * 5
    assert identity.fetches == 1


async def test_a_key_rotated_in_is_fetched_and_one_rotated_out_is_refused(
    gateway_url: str, ctx: Context, project: Project, identity: IdentityServer
) -> None:
    await trust(ctx, project, identity)
    old = identity.keys[0]
    earlier = old.sign()
    assert (await chat(gateway_url, earlier)).status_code == 200

    new = rsa_key("rsa-2")
    identity.keys = [new]  # the provider rotates: the new key published, the old one withdrawn
    assert (await chat(gateway_url, new.sign())).status_code == 200  # an unknown kid: the set is fetched again
    assert identity.fetches == 2
    assert (await chat(gateway_url, earlier)).status_code == 401  # verified before, but by a withdrawn key
    assert (await chat(gateway_url, old.sign(sub="another"))).status_code == 401


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"exp": int(time.time()) - 3600}, "expired"),
        ({"nbf": int(time.time()) + 3600}, "not_yet_valid"),
        ({"iss": "https://elsewhere.example/"}, None),  # no project trusts that issuer: nothing to verify against
        ({"aud": "another-app"}, None),
        ({"sub": None}, "no_subject"),
        ({"exp": None}, "no_expiry"),
    ],
)
async def test_a_token_with_bad_claims_is_refused(
    gateway_url: str,
    ctx: Context,
    project: Project,
    upstream: Upstream,
    identity: IdentityServer,
    claims: dict[str, Any],
    reason: str | None,
) -> None:
    await trust(ctx, project, identity)
    before = refusals(reason) if reason else 0

    response = await chat(gateway_url, identity.keys[0].sign(**claims))

    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert upstream.received == []
    if reason:
        assert refusals(reason) == before + 1


def b64(data: str | bytes) -> str:
    return base64.urlsafe_b64encode(data.encode() if isinstance(data, str) else data).rstrip(b"=").decode()


def refusals(reason: str) -> float:
    return REGISTRY.get_sample_value("credgate_identity_refusals_total", {"reason": reason}) or 0


async def test_a_token_signed_by_a_key_the_provider_never_published_is_refused(
    gateway_url: str, ctx: Context, project: Project, identity: IdentityServer
) -> None:
    await trust(ctx, project, identity)
    impostor = rsa_key("rsa-1")  # the published kid, another key
    assert (await chat(gateway_url, impostor.sign())).status_code == 401
    unknown = rsa_key("made-up")
    assert (await chat(gateway_url, unknown.sign())).status_code == 401


async def test_an_hmac_token_keyed_with_the_public_key_is_refused(
    gateway_url: str, ctx: Context, project: Project, identity: IdentityServer
) -> None:
    """Algorithm confusion: the published key as an HMAC secret must not pass for the provider's signature."""
    await trust(ctx, project, identity)
    public_pem = (
        identity.keys[0]
        .private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "exp": now + 300}
    signed = f"{b64(json.dumps({'alg': 'HS256', 'kid': 'rsa-1'}))}.{b64(json.dumps(claims))}"
    forged = f"{signed}.{b64(hmac.digest(public_pem, signed.encode(), 'sha256'))}"
    assert (await chat(gateway_url, forged)).status_code == 401
    unsigned = f"{b64(json.dumps({'alg': 'none', 'kid': 'rsa-1'}))}.{b64(json.dumps(claims))}."
    assert (await chat(gateway_url, unsigned)).status_code == 401


async def test_a_token_reaches_only_the_project_that_trusts_its_issuer_and_audience(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, identity: IdentityServer
) -> None:
    other = await add_project(ctx, upstream)
    await trust(ctx, project, identity)
    await trust(ctx, other, identity, audience="other-app")

    for_other = identity.keys[0].sign(aud="other-app", sub="bob")
    assert (await chat(gateway_url, for_other)).status_code == 200
    for _ in range(200):
        found = await usage.list_request_records(ctx, project_id=other.id)
        if found:
            break
        await asyncio.sleep(0.02)
    assert [record.subject for record in found] == ["bob"]
    assert await usage.list_request_records(ctx, project_id=project.id) == []


async def test_two_projects_cannot_trust_the_same_issuer_for_the_same_audience(
    ctx: Context, project: Project, upstream: Upstream, identity: IdentityServer
) -> None:
    other = await add_project(ctx, upstream)
    await trust(ctx, project, identity)
    with pytest.raises(Conflict):
        await trust(ctx, other, identity)


async def test_a_project_that_stops_trusting_refuses_at_once(
    gateway_url: str, ctx: Context, project: Project, identity: IdentityServer
) -> None:
    await trust(ctx, project, identity)
    token = identity.keys[1].sign()
    assert (await chat(gateway_url, token)).status_code == 200
    await projects.update_project(ctx, project_id=project.id, changes=ProjectChanges(identity_provider=None), actor="t")
    assert (await chat(gateway_url, token)).status_code == 401


async def test_an_identity_provider_that_does_not_answer_is_a_503_not_a_401(
    gateway_url: str, ctx: Context, project: Project, identity: IdentityServer
) -> None:
    provider = IdentityProviderSpec(jwks_url="http://127.0.0.1:9/jwks.json", issuer=ISSUER, audience=AUDIENCE)
    await projects.update_project(
        ctx, project_id=project.id, changes=ProjectChanges(identity_provider=provider), actor="t"
    )
    response = await chat(gateway_url, identity.keys[0].sign())
    assert response.status_code == 503
    assert response.headers["x-credgate-error"] == "true"
    assert project.id not in response.text  # a caller without a valid token learns nothing of any project


async def test_a_jwks_url_must_be_https_and_public_without_the_private_upstream_switch(
    ctx: Context, project: Project
) -> None:
    ctx.allow_private_upstreams = False
    for url in ("http://auth.example/jwks.json", "https://127.0.0.1/jwks.json", "https://169.254.169.254/keys"):
        provider = IdentityProviderSpec(jwks_url=url, issuer=ISSUER, audience=AUDIENCE)
        with pytest.raises(InvalidInput) as refused:
            await projects.update_project(
                ctx, project_id=project.id, changes=ProjectChanges(identity_provider=provider), actor="t"
            )
        assert refused.value.field == "identity_provider.jwks_url"


async def test_an_identity_token_beside_a_project_token_is_not_taken_for_it(
    gateway_url: str, ctx: Context, project: Project, identity: IdentityServer
) -> None:
    """A client may carry another service's JWT in Authorization beside its project token."""
    response = await chat(gateway_url, identity.keys[0].sign(), headers={"x-api-key": project.token})
    assert response.status_code == 200


async def test_an_identity_token_cannot_mint_client_tokens(
    gateway_url: str, ctx: Context, project: Project, identity: IdentityServer
) -> None:
    await trust(ctx, project, identity)
    async with httpx.AsyncClient(base_url=gateway_url) as client:
        refused = await client.post(
            "/api/v1/client-tokens", headers={"authorization": f"Bearer {identity.keys[0].sign()}"}, json={}
        )
    assert refused.status_code == 403
