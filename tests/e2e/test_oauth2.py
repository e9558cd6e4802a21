"""OAuth 2.0 upstreams: the gateway fetches, caches, renews and shares access tokens; failures are clear."""

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from aiohttp import web

from credgate.errors import InvalidInput
from credgate.services import integrations
from credgate.services.context import Context
from credgate.specs import AuthSpec, Endpoint, OAuth2ClientCredentialsAuth, OAuth2RefreshTokenAuth
from tests.e2e.conftest import Project
from tests.secret_sweep import SWEEP
from tests.upstream import Upstream

CLIENT_SECRET = "oauth-test-client-secret-0000abcd"
REFRESH_1, REFRESH_2 = "oauth-test-refresh-token-one-0001", "oauth-test-refresh-token-two-0002"
for _secret in (CLIENT_SECRET, REFRESH_1, REFRESH_2):
    SWEEP.register(_secret)


@dataclass
class TokenEndpoint:
    url: str = ""
    requests: list[tuple[dict[str, str], dict[str, str]]] = field(default_factory=list)  # (form, headers)
    status: int = 200
    lifetime: int = 3600
    delay: float = 0.0
    rotate_to: str | None = None


@pytest.fixture
async def token_endpoint() -> AsyncIterator[TokenEndpoint]:
    state = TokenEndpoint()

    async def issue(request: web.Request) -> web.Response:
        state.requests.append((dict(await request.post()), dict(request.headers)))  # type: ignore[arg-type]
        await asyncio.sleep(state.delay)
        if state.status != 200:
            return web.json_response({"error": "invalid_client"}, status=state.status)
        body: dict[str, object] = {
            "access_token": f"access-{len(state.requests)}",
            "token_type": "Bearer",
            "expires_in": state.lifetime,
        }
        if state.rotate_to:
            body["refresh_token"] = state.rotate_to
        return web.json_response(body)

    app = web.Application()
    app.router.add_post("/oauth/token", issue)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}/oauth/token"
    yield state
    await runner.cleanup()


async def add_oauth(ctx: Context, project: Project, upstream: Upstream, auth: AuthSpec, key: str) -> None:
    await integrations.add_custom_integration(
        ctx,
        project_id=project.id,
        provider="secured",
        base_url=f"{upstream.url}/echo",
        api_key=key,
        auth=auth,
        actor="t",
    )
    await integrations.set_endpoints(
        ctx, project_id=project.id, provider="secured", endpoints=[Endpoint(method="*", path="**")], actor="t"
    )


async def call(gateway_url: str, project: Project) -> httpx.Response:
    # These tests count token fetches, not time: 50 requests at once through one event loop, DEBUG logging on,
    # can outlast httpx's 5 s default on a loaded 2-core runner.
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(
            f"{gateway_url}/proxy/secured/v1/data", json={}, headers={"Authorization": f"Bearer {project.token}"}
        )


def client_credentials(endpoint: TokenEndpoint, **extra: str) -> OAuth2ClientCredentialsAuth:
    fields = {"method": "oauth2_client_credentials", "token_url": endpoint.url, "client_id": "credgate-client"}
    return OAuth2ClientCredentialsAuth.model_validate(fields | extra)


async def test_client_credentials_token_is_fetched_and_sent_as_bearer(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, token_endpoint: TokenEndpoint
) -> None:
    auth = client_credentials(token_endpoint, scope="read write", audience="https://api.example")
    await add_oauth(ctx, project, upstream, auth, CLIENT_SECRET)
    assert (await call(gateway_url, project)).status_code == 200
    assert upstream.last.header("authorization") == "Bearer access-1"
    form, headers = token_endpoint.requests[0]
    assert form == {"grant_type": "client_credentials", "scope": "read write", "audience": "https://api.example"}
    expected = base64.b64encode(f"credgate-client:{CLIENT_SECRET}".encode()).decode()
    assert headers["Authorization"] == f"Basic {expected}"


async def test_client_secret_post_puts_the_credentials_in_the_form(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, token_endpoint: TokenEndpoint
) -> None:
    await add_oauth(ctx, project, upstream, client_credentials(token_endpoint, client_auth="post"), CLIENT_SECRET)
    assert (await call(gateway_url, project)).status_code == 200
    form, headers = token_endpoint.requests[0]
    assert (form["client_id"], form["client_secret"]) == ("credgate-client", CLIENT_SECRET)
    assert "Authorization" not in headers


async def test_many_requests_at_once_share_one_fetch_and_later_ones_the_cached_token(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, token_endpoint: TokenEndpoint
) -> None:
    token_endpoint.delay = 0.2
    await add_oauth(ctx, project, upstream, client_credentials(token_endpoint), CLIENT_SECRET)
    responses = await asyncio.gather(*(call(gateway_url, project) for _ in range(50)))
    responses.append(await call(gateway_url, project))
    assert {response.status_code for response in responses} == {200}
    assert len(token_endpoint.requests) == 1
    assert {received.header("authorization") for received in upstream.received} == {"Bearer access-1"}


async def test_a_token_is_renewed_before_it_expires(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, token_endpoint: TokenEndpoint
) -> None:
    token_endpoint.lifetime = 1  # renewed in its last half
    await add_oauth(ctx, project, upstream, client_credentials(token_endpoint), CLIENT_SECRET)
    await call(gateway_url, project)
    await call(gateway_url, project)
    assert len(token_endpoint.requests) == 1
    await asyncio.sleep(0.6)
    await call(gateway_url, project)
    assert len(token_endpoint.requests) == 2
    assert upstream.last.header("authorization") == "Bearer access-2"


async def test_a_refused_fetch_is_a_clear_502_without_the_secret_and_is_not_retried_at_once(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, token_endpoint: TokenEndpoint
) -> None:
    token_endpoint.status = 401
    await add_oauth(ctx, project, upstream, client_credentials(token_endpoint), CLIENT_SECRET)
    first, second = await call(gateway_url, project), await call(gateway_url, project)
    assert (first.status_code, first.headers["x-credgate-error"]) == (502, "true")
    assert first.json()["error"]["message"] == "secured: the token endpoint refused the credentials (status 401)"
    assert second.status_code == 502
    assert CLIENT_SECRET not in first.text
    assert len(token_endpoint.requests) == 1
    assert upstream.received == []


async def test_a_rotated_refresh_token_is_sealed_and_used_next(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, token_endpoint: TokenEndpoint
) -> None:
    token_endpoint.lifetime, token_endpoint.rotate_to = 1, REFRESH_2
    auth = OAuth2RefreshTokenAuth(method="oauth2_refresh_token", token_url=token_endpoint.url, client_id="app")
    await add_oauth(ctx, project, upstream, auth, REFRESH_1)
    assert (await call(gateway_url, project)).status_code == 200
    stored = await integrations.get_integration(ctx, project_id=project.id, provider="secured")
    assert stored.key is not None
    assert stored.key.hint == "…0002"
    await asyncio.sleep(0.6)
    assert (await call(gateway_url, project)).status_code == 200
    assert [form["refresh_token"] for form, _ in token_endpoint.requests] == [REFRESH_1, REFRESH_2]
    assert json.loads(upstream.last.body or b"{}") == {}


async def test_a_private_token_url_is_refused_when_configured(ctx: Context, project: Project) -> None:
    ctx.allow_private_upstreams = False
    auth = OAuth2ClientCredentialsAuth(
        method="oauth2_client_credentials", token_url="https://169.254.169.254/token", client_id="c"
    )
    with pytest.raises(InvalidInput, match=r"^auth\.token_url: reaches a loopback"):
        await integrations.add_custom_integration(
            ctx,
            project_id=project.id,
            provider="secured",
            base_url="https://8.8.8.8/v1",
            api_key=CLIENT_SECRET,
            auth=auth,
            actor="t",
        )
