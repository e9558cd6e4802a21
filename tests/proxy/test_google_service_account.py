"""Google service accounts (README, Providers: Vertex AI): the JWT bearer grant's assertion, verified by
google-auth itself; the access token cached like any OAuth token; a key that is no service-account key file
refused at save (422 naming api_key) or, if one got stored anyway, a clear 502 at request time."""

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from credgate.app import create_app
from credgate.config import Settings
from credgate.crypto import Secret
from credgate.errors import BadGateway
from credgate.proxy.oauth import TokenBroker
from credgate.proxy.upstreams import Upstreams
from credgate.resolved import ResolvedIntegration
from credgate.services import integrations, projects
from credgate.services.context import Context
from credgate.services.integrations import IntegrationChanges
from credgate.specs import BearerAuth, GoogleServiceAccountAuth
from tests.e2e.conftest import serving
from tests.secret_sweep import SWEEP
from tests.service_accounts import (
    GoogleTokenEndpoint,
    ServiceAccount,
    new_service_account,
    run_google_token_endpoint,
)
from tests.upstream import Upstream, run_upstream

READ_ONLY = "https://www.googleapis.com/auth/cloud-platform.read-only"
GENERATE = "v1/projects/p-1/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent"


@pytest.fixture
def backend() -> str:
    """Real-socket tests run on SQLite; the storage and service tests cover PostgreSQL."""
    return "sqlite"


@pytest.fixture
async def gateway_url(settings: Settings, ctx: Context) -> AsyncIterator[str]:
    async with serving(create_app(settings, context=ctx), settings) as url:  # stand-ins on loopback allowed
        yield url


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    async with run_upstream() as running:
        yield running


@pytest.fixture(scope="module")
def account() -> ServiceAccount:
    return new_service_account()


@pytest.fixture
async def token_endpoint(account: ServiceAccount) -> AsyncIterator[GoogleTokenEndpoint]:
    async with run_google_token_endpoint(account) as running:
        yield running


@pytest.fixture
async def broker() -> AsyncIterator[TokenBroker]:
    async def no_refresh_tokens(project_id: str, provider: str, token: str) -> None:
        raise AssertionError("a service account has no refresh token")

    upstreams = Upstreams(allow_private=True)  # stand-ins on loopback
    try:
        yield TokenBroker(upstreams, store_refresh_token=no_refresh_tokens)
    finally:
        await upstreams.close()


def vertex(auth: GoogleServiceAccountAuth, key: str) -> ResolvedIntegration:
    return ResolvedIntegration(
        provider="vertex",
        base_url="https://us-central1-aiplatform.googleapis.com",
        auth=auth,
        endpoints=(),
        headers={},
        query={},
        enabled=True,
        timeout_seconds=60,
        stream_idle_timeout_seconds=60,
        total_timeout_seconds=600,
        credential=Secret(key),
    )


def with_fields(account: ServiceAccount, **fields: str) -> str:
    """The account's key file with some fields changed, registered with the sweep."""
    key_file = json.dumps(json.loads(account.key_file) | fields, indent=2)
    SWEEP.register(key_file)
    return key_file


def pem(private_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, *, password: bytes | None = None) -> str:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    text = private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    SWEEP.register(text.decode())
    return text.decode()


def key_parts(key_file: str) -> list[str]:
    """Pieces of a stored key that must appear nowhere: the key file itself and its private key's base64 lines."""
    return [key_file, *re.findall(r"[A-Za-z0-9+/=]{40,}", key_file.replace("\\n", "\n"))]


# the assertion


async def test_the_assertion_is_a_jwt_bearer_grant_google_auth_verifies(
    broker: TokenBroker, token_endpoint: GoogleTokenEndpoint, account: ServiceAccount
) -> None:
    # The JSON's own token_uri is not used: here a port where nothing answers.
    key_file = with_fields(account, token_uri="http://127.0.0.1:9/token")
    spec = GoogleServiceAccountAuth(method="google_service_account", token_url=token_endpoint.url, scope=READ_ONLY)
    before = time.time()

    token = await broker.access_token(project_id="prj_1", integration=vertex(spec, key_file), secret=Secret(key_file))

    assert token.reveal() == token_endpoint.issued[0]
    assert token_endpoint.refused == []
    [claims] = token_endpoint.grants  # verified by google-auth: signature, audience, times
    assert {name: claims[name] for name in ("iss", "scope", "aud")} == {
        "iss": account.client_email,
        "scope": READ_ONLY,
        "aud": token_endpoint.url,
    }
    assert claims["exp"] - claims["iat"] == 3600
    assert before - 1 <= claims["iat"] <= time.time()
    assert token_endpoint.headers[0] == {"alg": "RS256", "typ": "JWT", "kid": account.key_id}
    body = token_endpoint.bodies[0].decode()
    assert body.startswith("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=")
    assert not any(part in body for part in key_parts(key_file))


async def test_the_default_scope_is_cloud_platform(
    broker: TokenBroker, token_endpoint: GoogleTokenEndpoint, account: ServiceAccount
) -> None:
    spec = GoogleServiceAccountAuth(method="google_service_account", token_url=token_endpoint.url)
    key = Secret(account.key_file)
    await broker.access_token(project_id="prj_1", integration=vertex(spec, account.key_file), secret=key)
    assert token_endpoint.grants[0]["scope"] == "https://www.googleapis.com/auth/cloud-platform"


async def test_the_access_token_is_fetched_once_and_cached(
    broker: TokenBroker, token_endpoint: GoogleTokenEndpoint, account: ServiceAccount
) -> None:
    spec = GoogleServiceAccountAuth(method="google_service_account", token_url=token_endpoint.url)
    integration, key = vertex(spec, account.key_file), Secret(account.key_file)
    together = await asyncio.gather(
        *(broker.access_token(project_id="prj_1", integration=integration, secret=key) for _ in range(5))
    )
    later = await broker.access_token(project_id="prj_1", integration=integration, secret=key)
    assert {token.reveal() for token in [*together, later]} == {token_endpoint.issued[0]}
    assert len(token_endpoint.bodies) == 1


async def test_a_request_that_leaves_mid_fetch_does_not_strand_the_others(
    broker: TokenBroker, token_endpoint: GoogleTokenEndpoint, account: ServiceAccount
) -> None:
    """The first request's client goes away while the token is being fetched: the requests that wait on the
    same fetch still get the token, and the fetch is not repeated."""
    spec = GoogleServiceAccountAuth(method="google_service_account", token_url=token_endpoint.url)
    integration, key = vertex(spec, account.key_file), Secret(account.key_file)
    token_endpoint.delay = 0.3
    first = asyncio.create_task(broker.access_token(project_id="prj_1", integration=integration, secret=key))
    await asyncio.sleep(0.1)  # the fetch has started
    waiting = asyncio.create_task(broker.access_token(project_id="prj_1", integration=integration, secret=key))
    await asyncio.sleep(0)
    first.cancel()
    token = await asyncio.wait_for(waiting, timeout=5)
    assert token.reveal() == token_endpoint.issued[0]
    assert first.cancelled()
    assert len(token_endpoint.bodies) == 1
    later = await broker.access_token(project_id="prj_1", integration=integration, secret=key)
    assert later.reveal() == token.reveal()


async def test_an_assertion_signed_with_another_key_is_refused_by_google_and_is_a_502(
    broker: TokenBroker, token_endpoint: GoogleTokenEndpoint, account: ServiceAccount
) -> None:
    impostor = with_fields(account, private_key=pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)))
    spec = GoogleServiceAccountAuth(method="google_service_account", token_url=token_endpoint.url)
    with pytest.raises(BadGateway, match=r"vertex: the token endpoint refused the credentials \(status 400\)"):
        await broker.access_token(project_id="prj_1", integration=vertex(spec, impostor), secret=Secret(impostor))
    assert token_endpoint.grants == []
    assert token_endpoint.refused == ["Could not verify token signature."]


def unusable_keys(account: ServiceAccount) -> list[str]:
    garbage = "-----BEGIN PRIVATE KEY-----\nbm90LWEta2V5LWp1c3QtdGV4dC0wMDAx\n-----END PRIVATE KEY-----\n"
    return [
        with_fields(account, private_key=garbage),
        with_fields(account, private_key=pem(ec.generate_private_key(ec.SECP256R1()))),
        with_fields(account, private_key=pem(rsa.generate_private_key(65537, 2048), password=b"pass-0000")),
        "sk-an-opaque-key-stored-before-the-auth-changed-0001",
    ]


async def test_a_stored_key_that_cannot_sign_is_a_clear_502_without_the_key(
    broker: TokenBroker, token_endpoint: GoogleTokenEndpoint, account: ServiceAccount
) -> None:
    spec = GoogleServiceAccountAuth(method="google_service_account", token_url=token_endpoint.url)
    for key_file in unusable_keys(account):
        SWEEP.register(key_file)
        with pytest.raises(BadGateway) as raised:
            await broker.access_token(project_id="prj_1", integration=vertex(spec, key_file), secret=Secret(key_file))
        message = str(raised.value)
        assert message.startswith("vertex: the stored key is not a usable Google service-account JSON key file")
        assert not any(part in message for part in key_parts(key_file))
    assert token_endpoint.bodies == []


# saving a key: the admin API


async def new_project(client: httpx.AsyncClient) -> str:
    response = await client.post("/api/v1/projects", json={"name": "vertex"})
    assert response.status_code == 201, response.text
    project_id: str = response.json()["project"]["id"]
    return project_id


def malformed_keys(account: ServiceAccount) -> list[str]:
    info = json.loads(account.key_file)
    return [
        "AIzaSy-a-gemini-api-key-instead-0000001",  # not JSON
        json.dumps([info]),  # not an object
        json.dumps({name: value for name, value in info.items() if name != "private_key"}),
        json.dumps(info | {"client_email": 42}),
        json.dumps(info | {"private_key": info["private_key"].replace("-----BEGIN PRIVATE KEY-----", "")}),
        account.key_file[:-40],  # cut short in the copy
    ]


def refused_without_echo(response: httpx.Response, key: str) -> None:
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert message.startswith("api_key: must be the service account's JSON key file")
    assert not any(part in response.text for part in key_parts(key))


async def test_a_malformed_key_is_refused_at_every_place_a_key_is_set(
    client: httpx.AsyncClient, account: ServiceAccount
) -> None:
    project_id = await new_project(client)
    integrations_url = f"/api/v1/projects/{project_id}/integrations"
    custom = {"provider": "vertex-eu", "base_url": "https://europe-west4-aiplatform.googleapis.com"}
    for key in malformed_keys(account):
        SWEEP.register(key)
        template = {"provider": "vertex", "template": "vertex-generate-content", "api_key": key}
        refused_without_echo(await client.post(integrations_url, json=template), key)
        auth = {"method": "google_service_account"}
        refused_without_echo(await client.post(integrations_url, json=custom | {"api_key": key, "auth": auth}), key)
    assert (await client.get(integrations_url)).json() == {"items": []}

    template = {"provider": "vertex", "template": "vertex-generate-content", "api_key": account.key_file}
    created = await client.post(integrations_url, json=template)
    assert created.status_code == 201, created.text
    assert created.json()["key"]["hint"] == "…" + account.key_id[-4:]  # the key id's end, as Google's console shows
    for key in malformed_keys(account):
        refused_without_echo(await client.put(f"{integrations_url}/vertex/key", json={"api_key": key}), key)
    assert (await client.get(f"{integrations_url}/vertex")).json()["key"] == created.json()["key"]  # kept


# a bad key stored anyway: the request


async def proxied(gateway_url: str, token: str) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.post(
            f"{gateway_url}/proxy/vertex/{GENERATE}",
            headers={"Authorization": f"Bearer {token}"},
            json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        )


async def test_a_key_file_whose_private_key_does_not_load_is_a_502_at_request_time(
    ctx: Context, gateway_url: str, upstream: Upstream, token_endpoint: GoogleTokenEndpoint, account: ServiceAccount
) -> None:
    project, token = await projects.create_project(ctx, name="vertex", actor="t")
    broken = unusable_keys(account)[0]  # PEM markers around no key: the shape check cannot tell
    await integrations.add_template_integration(
        ctx,
        project_id=project.id,
        provider="vertex",
        template_id="vertex-generate-content",
        api_key=broken,
        base_url=f"{upstream.url}/echo",
        actor="t",
    )
    auth = GoogleServiceAccountAuth(method="google_service_account", token_url=token_endpoint.url)
    changes = IntegrationChanges(auth=auth)
    await integrations.update_integration(ctx, project_id=project.id, provider="vertex", changes=changes, actor="t")

    response = await proxied(gateway_url, token)

    assert response.status_code == 502
    assert "not a usable Google service-account JSON key file" in response.json()["error"]["message"]
    assert not any(part in response.text for part in key_parts(broken))
    assert token_endpoint.bodies == []
    assert upstream.received == []


async def test_an_auth_changed_to_a_service_account_over_an_opaque_key_is_a_502(
    ctx: Context, gateway_url: str, upstream: Upstream, token_endpoint: GoogleTokenEndpoint
) -> None:
    """PATCH may change the method under a stored key that does not fit it: the request says so."""
    project, token = await projects.create_project(ctx, name="vertex", actor="t")
    opaque = "sk-opaque-key-of-a-bearer-integration-0002"
    SWEEP.register(opaque)
    await integrations.add_custom_integration(
        ctx, project_id=project.id, provider="vertex", base_url=f"{upstream.url}/echo", api_key=opaque,
        auth=BearerAuth(), actor="t",
    )  # fmt: skip
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="vertex", template_id="vertex-generate-content", actor="t"
    )
    auth = GoogleServiceAccountAuth(method="google_service_account", token_url=token_endpoint.url)
    changes = IntegrationChanges(auth=auth)
    await integrations.update_integration(ctx, project_id=project.id, provider="vertex", changes=changes, actor="t")

    response = await proxied(gateway_url, token)

    assert response.status_code == 502
    assert "set the key again" in response.json()["error"]["message"]
    assert opaque not in response.text
    assert token_endpoint.bodies == []
    assert upstream.received == []
