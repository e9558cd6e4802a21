"""Per-integration exceptions to the SSRF guard, over real sockets, with the gateway's guard on
(CREDGATE_ALLOW_PRIVATE_UPSTREAMS unset): the integration that lists a private host reaches its stand-in over plain
http; every other integration (same project or another, same host:port, right after) is refused as before, and
link-local is never reached whatever is listed.

DNS is the test's own (`Dns`): it answers the names a test chooses, and its firewall records every dial and refuses
any beyond loopback, so nothing leaves the machine whatever the product does.
"""

import asyncio
import errno
import ipaddress
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web

from credgate.app import create_app
from credgate.config import Settings
from credgate.errors import InvalidInput
from credgate.services import integrations, projects
from credgate.services.context import Context
from credgate.specs import AuthSpec, Endpoint, OAuth2ClientCredentialsAuth
from tests.e2e.conftest import EVERY_PORT, serving
from tests.secret_sweep import SWEEP
from tests.upstream import Upstream

NOT_PUBLIC = "{provider}'s address is not public; refused (CREDGATE_ALLOW_PRIVATE_UPSTREAMS)"
CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "Hi"}]}


@dataclass
class Dns:
    answers: dict[str, list[str]] = field(default_factory=dict)
    dials: list[tuple[str, int]] = field(default_factory=list)  # every connection made, the gateway's own too

    def beyond(self, gateway_url: str) -> list[str]:
        """The addresses dialled, but for the test client's connections to the gateway."""
        gateway = ("127.0.0.1", int(gateway_url.rsplit(":", 1)[1]))
        return [address for address, port in self.dials if (address, port) != gateway]


@pytest.fixture(autouse=True)
async def dns(monkeypatch: pytest.MonkeyPatch) -> Dns:
    """The test network, on the event loop that the gateway, its outbound client and the services share."""
    seam = Dns({"ollama.test": ["127.0.0.1"], "localhost": ["127.0.0.1"], "meta.test": ["169.254.169.254"]})
    loop = asyncio.get_running_loop()
    real_getaddrinfo, real_sock_connect = loop.getaddrinfo, loop.sock_connect

    async def getaddrinfo(host: bytes | str | None, port: Any, **options: Any) -> list[Any]:
        name = (host.decode() if isinstance(host, bytes) else host or "").lower().removesuffix(".")
        if name not in seam.answers:  # never the machine's resolver
            options["flags"] = options.get("flags", 0) | socket.AI_NUMERICHOST
            return await real_getaddrinfo(host, port, **options)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0))) for address in seam.answers[name]
        ]

    async def sock_connect(sock: socket.socket, address: Any) -> None:
        seam.dials.append((address[0], address[1]))
        if not ipaddress.ip_address(address[0].split("%", 1)[0]).is_loopback:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "beyond loopback: refused by the test network")
        await real_sock_connect(sock, address)

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(loop, "sock_connect", sock_connect)
    return seam


@pytest.fixture
async def guarded_url(settings: Settings, ctx: Context) -> AsyncIterator[str]:
    """The gateway with the guard on; the services (`ctx`) check with it on too."""
    # Every port: the test network's stand-ins listen where the system puts them.
    guarded = settings.model_copy(update={"allow_private_upstreams": False, "upstream_ports": EVERY_PORT})
    ctx.allow_private_upstreams = False
    async with serving(create_app(guarded, context=ctx), guarded) as url:
        yield url


@dataclass
class Tenant:
    id: str
    token: str


async def tenant(ctx: Context, name: str) -> Tenant:
    project, token = await projects.create_project(ctx, name=name, actor="t")
    return Tenant(project.id, token)


@pytest.fixture
async def first(ctx: Context) -> Tenant:
    return await tenant(ctx, "self-hosted")


@pytest.fixture
async def second(ctx: Context) -> Tenant:
    return await tenant(ctx, "another")


async def add(
    ctx: Context,
    owner: Tenant,
    provider: str,
    base_url: str,
    networks: list[str] | None = None,
    *,
    auth: AuthSpec | None = None,
) -> str:
    """A custom integration allowing every path, with its own key (registered with the sweep); returns the key."""
    key = f"sk-{provider}-" + secrets.token_urlsafe(12)
    SWEEP.register(key)
    await integrations.add_custom_integration(
        ctx,
        project_id=owner.id,
        provider=provider,
        base_url=base_url,
        api_key=key,
        auth=auth,
        private_networks=networks,
        actor="t",
    )
    everything = [Endpoint(method="*", path="**")]
    await integrations.set_endpoints(ctx, project_id=owner.id, provider=provider, endpoints=everything, actor="t")
    return key


async def add_unguarded(ctx: Context, owner: Tenant, provider: str, base_url: str, *args: Any, **kwargs: Any) -> str:
    """Stored as a row written before the guard was turned on (or without it) would be: the proxy is the judge."""
    ctx.allow_private_upstreams = True
    try:
        return await add(ctx, owner, provider, base_url, *args, **kwargs)
    finally:
        ctx.allow_private_upstreams = False


async def chat(http: httpx.AsyncClient, url: str, owner: Tenant, provider: str) -> httpx.Response:
    return await http.post(
        f"{url}/proxy/{provider}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {owner.token}"}
    )


def refusal(response: httpx.Response, provider: str) -> tuple[int, str]:
    assert response.headers.get("x-credgate-error") == "true", response.text
    return response.status_code, str(response.json()["error"]["message"]).replace(provider, "{provider}")


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


async def test_an_integration_listing_loopback_reaches_its_stand_in_over_plain_http(
    guarded_url: str, ctx: Context, first: Tenant, upstream: Upstream, http: httpx.AsyncClient
) -> None:
    with pytest.raises(InvalidInput, match=r"^base_url: must use https"):  # without the exception: as before
        await add(ctx, first, "local", upstream.url)
    key = await add(ctx, first, "local", upstream.url, ["127.0.0.1"])
    response = await chat(http, guarded_url, first, "local")
    assert (response.status_code, response.json()["model"]) == (200, "llama3")
    assert upstream.last.path_qs == "/v1/chat/completions"
    assert upstream.last.header("authorization") == f"Bearer {key}"


async def test_an_integration_listing_a_name_reaches_it_whatever_private_address_it_resolves_to(
    guarded_url: str, ctx: Context, first: Tenant, upstream: Upstream, http: httpx.AsyncClient, dns: Dns
) -> None:
    port = upstream.url.rsplit(":", 1)[1]
    await add(ctx, first, "local", f"http://Ollama.Test.:{port}", ["ollama.test"])
    assert (await chat(http, guarded_url, first, "local")).status_code == 200
    assert dns.beyond(guarded_url) == ["127.0.0.1"]


async def test_the_same_stand_in_through_an_integration_without_the_exception_is_refused(
    guarded_url: str, ctx: Context, first: Tenant, second: Tenant, upstream: Upstream, http: httpx.AsyncClient
) -> None:
    await add(ctx, first, "local", upstream.url, ["127.0.0.1"])
    await add_unguarded(ctx, first, "plain", upstream.url)  # the same project
    await add_unguarded(ctx, second, "local", upstream.url)  # another project, the same provider name
    await add_unguarded(ctx, second, "vpc", upstream.url, ["10.0.0.0/8"])  # another project, other exceptions
    assert (await chat(http, guarded_url, first, "local")).status_code == 200
    assert refusal(await chat(http, guarded_url, first, "plain"), "plain") == (502, NOT_PUBLIC)
    assert refusal(await chat(http, guarded_url, second, "local"), "local") == (502, NOT_PUBLIC)
    assert refusal(await chat(http, guarded_url, second, "vpc"), "vpc") == (502, NOT_PUBLIC)
    assert len(upstream.received) == 1


async def test_a_pooled_connection_opened_under_an_exception_never_serves_another_integration(
    guarded_url: str,
    ctx: Context,
    first: Tenant,
    second: Tenant,
    upstream: Upstream,
    http: httpx.AsyncClient,
    dns: Dns,
) -> None:
    """The stand-in keeps its connections alive, and every integration here names the same host:port: were the
    pools shared, the refused ones would be served by the connection the first one left open."""
    base_url = f"http://ollama.test:{upstream.url.rsplit(':', 1)[1]}"
    await add(ctx, first, "local", base_url, ["ollama.test"])
    await add_unguarded(ctx, second, "local", base_url)
    await add_unguarded(ctx, first, "vpc", base_url, ["10.0.0.0/8"])
    for _round in range(2):
        assert (await chat(http, guarded_url, first, "local")).status_code == 200
        assert refusal(await chat(http, guarded_url, second, "local"), "local") == (502, NOT_PUBLIC)
        assert refusal(await chat(http, guarded_url, first, "vpc"), "vpc") == (502, NOT_PUBLIC)
    assert len(upstream.received) == 2
    assert dns.beyond(guarded_url) == ["127.0.0.1"]  # one connection, opened for `local` and reused by it alone


async def test_a_listed_network_or_name_opens_nothing_else(
    guarded_url: str, ctx: Context, first: Tenant, upstream: Upstream, http: httpx.AsyncClient, dns: Dns
) -> None:
    port = upstream.url.rsplit(":", 1)[1]
    with pytest.raises(InvalidInput, match=r"^base_url: reaches a loopback, .* outside its private_networks"):
        await add(ctx, first, "vpc", upstream.url, ["10.0.0.0/8"])
    with pytest.raises(InvalidInput, match=r"^base_url: reaches a loopback, .* outside its private_networks"):
        await add(ctx, first, "neighbour", f"http://127.0.0.2:{port}", ["127.0.0.1"])
    with pytest.raises(InvalidInput, match=r"^base_url: must use https, unless its host is listed"):
        await add(ctx, first, "other-host", f"http://localhost:{port}", ["ollama.test"])
    await add_unguarded(ctx, first, "vpc", upstream.url, ["10.0.0.0/8"])
    await add_unguarded(ctx, first, "neighbour", f"http://127.0.0.2:{port}", ["127.0.0.1"])
    await add_unguarded(ctx, first, "other-host", f"http://localhost:{port}", ["ollama.test"])
    for provider in ("vpc", "neighbour", "other-host"):
        assert refusal(await chat(http, guarded_url, first, provider), provider) == (502, NOT_PUBLIC)
    assert (upstream.received, dns.beyond(guarded_url)) == ([], [])


async def test_link_local_is_never_reached_even_when_someone_lists_it(
    guarded_url: str, ctx: Context, first: Tenant, http: httpx.AsyncClient, dns: Dns
) -> None:
    with pytest.raises(InvalidInput, match=r"^private_networks: entry 1 may never include link-local"):
        await add(ctx, first, "meta", "http://169.254.169.254/latest", ["169.254.169.254"])
    with pytest.raises(InvalidInput, match=r"^base_url: reaches a link-local or cloud metadata address"):
        await add(ctx, first, "meta", "http://meta.test/latest", ["meta.test"])  # a listed name answering it
    await add_unguarded(ctx, first, "meta", "http://meta.test/latest", ["meta.test"])
    await add_unguarded(ctx, first, "literal", "http://169.254.169.254/latest", ["10.0.0.0/8"])
    async with ctx.database.transaction() as repo:  # a row edited by hand to list link-local
        row = await repo.get_integration(first.id, "literal")
        assert row is not None
        row.private_networks = ["169.254.0.0/16", "fd00:ec2::254/128"]
    ctx.access.invalidate()
    for provider in ("meta", "literal"):
        assert refusal(await chat(http, guarded_url, first, provider), provider) == (502, NOT_PUBLIC)
    assert dns.beyond(guarded_url) == []


async def test_an_oauth_token_endpoint_is_reached_within_the_integrations_exceptions_only(
    guarded_url: str, ctx: Context, first: Tenant, second: Tenant, upstream: Upstream, http: httpx.AsyncClient
) -> None:
    issued: list[str] = []

    async def issue(request: web.Request) -> web.Response:
        issued.append(str((await request.post())["grant_type"]))
        return web.json_response({"access_token": "access-private", "token_type": "Bearer", "expires_in": 3600})

    app = web.Application()
    app.router.add_post("/oauth/token", issue)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        token_url = f"http://127.0.0.1:{runner.addresses[0][1]}/oauth/token"
        auth = OAuth2ClientCredentialsAuth(method="oauth2_client_credentials", token_url=token_url, client_id="c")
        await add(ctx, first, "secured", upstream.url, ["127.0.0.1"], auth=auth)
        await add_unguarded(ctx, second, "secured", upstream.url, auth=auth)
        assert (await chat(http, guarded_url, first, "secured")).status_code == 200
        assert upstream.last.header("authorization") == "Bearer access-private"
        refused = await chat(http, guarded_url, second, "secured")
        assert refusal(refused, "secured") == (502, "{provider}: the token endpoint's address is not public; refused")
        assert (issued, len(upstream.received)) == (["client_credentials"], 1)
    finally:
        await runner.cleanup()


async def test_the_exception_is_set_shown_and_audited_through_the_admin_api(
    guarded_url: str,
    ctx: Context,
    client: httpx.AsyncClient,
    first: Tenant,
    upstream: Upstream,
    http: httpx.AsyncClient,
) -> None:
    base = f"/api/v1/projects/{first.id}/integrations"
    body = {"provider": "local", "base_url": upstream.url, "api_key": "sk-test-private-api-0000abcd"}
    SWEEP.register(body["api_key"])
    refused = await client.post(base, json=body | {"private_networks": ["fe80::1"]})
    assert (refused.status_code, refused.json()["error"]["message"]) == (
        422,
        "private_networks: entry 1 may never include link-local (169.254.0.0/16, fe80::/10), cloud metadata or "
        "Teredo addresses",
    )
    assert (await client.post(base, json=body)).status_code == 422  # no exception: the guard refuses it
    created = await client.post(base, json=body | {"private_networks": ["127.0.0.1", "Ollama.Test."]})
    assert (created.status_code, created.json()["private_networks"]) == (201, ["127.0.0.1/32", "ollama.test"])
    await client.put(f"{base}/local/endpoints", json={"endpoints": [{"method": "*", "path": "**"}]})
    assert (await chat(http, guarded_url, first, "local")).status_code == 200
    patched = await client.patch(f"{base}/local", json={"private_networks": []})
    assert patched.json()["private_networks"] == []
    assert (await client.get(f"{base}/local")).json()["private_networks"] == []
    assert refusal(await chat(http, guarded_url, first, "local"), "local") == (502, NOT_PUBLIC)
    events = (await client.get("/api/v1/audit", params={"project_id": first.id})).json()["items"]
    exceptions = [event for event in events if event["action"] == "integration.private_networks"]
    assert [(event["provider"], event["detail"]) for event in exceptions] == [
        ("local", {"private_networks": []}),
        ("local", {"private_networks": ["127.0.0.1/32", "ollama.test"]}),
    ]
    assert all(event["actor"] == "admin-token:tests" for event in exceptions)
    assert len(upstream.received) == 1
