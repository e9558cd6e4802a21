"""Catalogue group SS: SSRF and egress, black-box. Save time through the admin API (422 naming the field),
connect time through the proxy over real sockets (502), with the guard on unless a test says otherwise.

Every test runs on a test network (`Network`): DNS answers the test chooses, public names routed to loopback
stand-ins, and a firewall that refuses, and records, any connection beyond loopback, so no packet leaves the
machine whatever the product does. The hidden-treasure canary listens on 127.0.0.1, 127.0.0.2 and ::1 and
counts connections; every test asserts it got none.
"""

import asyncio
import errno
import ipaddress
import socket
import ssl
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

from credgate.app import create_app
from credgate.config import Settings
from credgate.proxy.guard import NonPublicAddress
from credgate.services.context import Context
from credgate.specs import OAuth2ClientCredentialsAuth
from tests.conftest import POSTGRES_URL, REQUIRE_POSTGRES
from tests.e2e.conftest import EVERY_PORT, Project, add_custom, serving
from tests.upstream import Upstream

NOT_PUBLIC = (
    "reaches a loopback, private, link-local or otherwise non-public address "
    "(set CREDGATE_ALLOW_PRIVATE_UPSTREAMS to allow it)"
)
# One wording whether the base URL names a literal address or a name that resolves to one.
REFUSED_BY_ADDRESS = REFUSED_BY_ANSWER = (
    "{provider}'s address is not public; refused (CREDGATE_ALLOW_PRIVATE_UPSTREAMS)"
)
# SS-01: the catalogue's spellings of this machine, plus the canary's alias and IDNA full-width digits.
LOOPBACK = [
    "127.0.0.1",
    "127.1",
    "0.0.0.0",  # noqa: S104  (a destination here, never bound)
    "localhost",
    "LOCALHOST.",
    "2130706433",
    "0x7f000001",
    "017700000001",
    "[::1]",
    "[::ffff:127.0.0.1]",
    "[0:0:0:0:0:ffff:7f00:1]",
    "127.0.0.2",
    "１２７.０.０.１",
    "127.0.0.1.nip.io",  # a name whose DNS answer is loopback (the test network answers it)
]
# SS-02: private, shared, link-local and metadata, multicast, reserved, unspecified, and IPv4 inside IPv6.
PRIVATE = [
    "10.0.0.5",
    "172.16.0.1",
    "172.31.255.254",
    "192.168.1.1",
    "100.64.0.1",
    "169.254.169.254",
    "[fd00:ec2::254]",
    "[fc00::1]",
    "[fe80::1]",
    "224.0.0.1",
    "240.0.0.1",
    "[::]",
    "[64:ff9b::a9fe:a9fe]",
    "[2002:a9fe:a9fe::]",
    "metadata.google.internal",
]
# SS-03: names that look public and are not, by their DNS answer (the catalogue's own).
ANSWERS = {"internal.test": ["10.0.0.5"], "mixed.test": ["93.184.216.34", "127.0.0.1"], "v6.test": ["::1"]}


# The test network


def _on_this_machine(host: str) -> bool:
    """Loopback, or unspecified (a connection to 0.0.0.0 or :: reaches this machine's own listeners)."""
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


class Network:
    """DNS answers the test chooses (`answer`), public names routed to loopback stand-ins (`publish`), and a
    firewall that refuses every other address beyond loopback, recording the attempt in `refused`.

    It replaces the event loop's `getaddrinfo` and `sock_connect`: the upstream client's resolver asks the first,
    and it dials with the second, so `queries` and `dials` are exactly what the gateway looked up and where it
    connected."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.answers: dict[str, list[list[str]]] = {}
        self.routes: dict[str, int] = {}  # public address → the loopback port it reaches
        self.queries: list[str] = []
        self.dials: list[tuple[str, int]] = []
        self.refused: list[tuple[str, int]] = []
        self._getaddrinfo = loop.getaddrinfo
        self._sock_connect = loop.sock_connect

    def answer(self, name: str, *answers: list[str]) -> None:
        """Answer `name` with each answer in turn; the last one repeats (a rebinding name has two)."""
        self.answers[name] = list(answers)

    def publish(self, name: str, port: int) -> str:
        """Give `name` a public address that reaches the loopback stand-in on `port`."""
        address = str(ipaddress.ip_address("93.184.216.100") + len(self.routes))
        self.routes[address] = port
        self.answer(name, [address])
        return address

    async def getaddrinfo(self, host: bytes | str | None, port: Any, **options: Any) -> list[Any]:
        name = (host.decode() if isinstance(host, bytes) else host or "").lower().removesuffix(".")
        if name not in self.answers:  # any other name is unknown here: never ask the machine's resolver
            options["flags"] = options.get("flags", 0) | socket.AI_NUMERICHOST
            return await self._getaddrinfo(host, port, **options)
        self.queries.append(name)
        sequence = self.answers[name]
        addresses = sequence.pop(0) if len(sequence) > 1 else sequence[0]
        port = int(port or 0)
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))
            if ":" in address
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))
            for address in addresses
        ]

    async def sock_connect(self, sock: socket.socket, address: Any) -> None:
        host, port = address[0], address[1]
        self.dials.append((host, port))
        if host in self.routes:
            address = ("127.0.0.1", self.routes[host])
        elif not _on_this_machine(host):
            self.refused.append((host, port))
            raise ConnectionRefusedError(errno.ECONNREFUSED, "beyond loopback: refused by the test network")
        await self._sock_connect(sock, address)

    def dialed(self, port: int) -> list[str]:
        return [host for host, dialed in self.dials if dialed == port]


@pytest.fixture(autouse=True)
async def network(monkeypatch: pytest.MonkeyPatch) -> Network:
    """Installed on the test's event loop, which the gateway, its outbound client and the admin API share."""
    loop = asyncio.get_running_loop()
    network = Network(loop)
    monkeypatch.setattr(loop, "getaddrinfo", network.getaddrinfo)
    monkeypatch.setattr(loop, "sock_connect", network.sock_connect)
    network.answer("127.0.0.1.nip.io", ["127.0.0.1"])
    for name, addresses in ANSWERS.items():
        network.answer(name, addresses)
    return network


@dataclass
class Canary:
    """The hidden treasure: loopback services that count every connection and answer `hidden treasure`."""

    port: int = 0
    hits: int = 0


@pytest.fixture
async def canary() -> AsyncIterator[Canary]:
    state = Canary()

    async def treasure(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.hits += 1
        try:
            async with asyncio.timeout(1):
                await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\nConnection: close\r\n\r\nhidden treasure")
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    servers: list[asyncio.Server] = []
    for _attempt in range(5):  # the same free port on every loopback address
        first = await asyncio.start_server(treasure, "127.0.0.1", 0)
        servers = [first]
        state.port = first.sockets[0].getsockname()[1]
        try:
            for alias in ("127.0.0.2", "::1"):
                servers.append(await asyncio.start_server(treasure, alias, state.port))
            break
        except OSError:
            for server in servers:
                server.close()
    else:
        raise RuntimeError("no port free on every loopback address")
    try:
        yield state
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()


@dataclass(frozen=True)
class Seen:
    path: str
    host: str | None
    authorization: str | None


@dataclass
class Provider:
    """A provider stand-in on loopback, published under public names: it records what reaches it, answers
    JSON or the redirect `redirects` names for a path, and closes every connection (each request then makes a
    new one, with a new DNS lookup). Over TLS it records the server names (SNI) clients ask for."""

    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    redirects: dict[str, tuple[int, str]] = field(default_factory=dict)
    server_names: list[str | None] = field(default_factory=list)


@asynccontextmanager
async def run_provider(tls: ssl.SSLContext | None = None) -> AsyncIterator[Provider]:
    state = Provider()

    async def answer(request: web.Request) -> web.Response:
        state.seen.append(Seen(request.path, request.headers.get("Host"), request.headers.get("Authorization")))
        status, location = state.redirects.get(request.path, (200, ""))
        response = (
            web.Response(status=status, headers={"Location": location}) if location else web.json_response({"ok": True})
        )
        response.force_close()
        return response

    if tls is not None:
        tls.sni_callback = lambda _socket, name, _context: state.server_names.append(name)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    state.port = runner.addresses[0][1]
    try:
        yield state
    finally:
        await runner.cleanup()


@pytest.fixture
async def provider(network: Network) -> AsyncIterator[Provider]:
    """The stand-in, published as api.public.test, auth.public.test and other.public.test."""
    async with run_provider() as running:
        for name in ("api.public.test", "auth.public.test", "other.public.test"):
            network.publish(name, running.port)
        yield running


# The gateway and the admin API with the guard on


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """SQLite for the real-socket tests; the admin API tests ask for both backends (`BOTH_BACKENDS`)."""
    name = str(getattr(request, "param", "sqlite"))
    if name == "postgresql" and not POSTGRES_URL:
        if REQUIRE_POSTGRES:
            pytest.fail("CREDGATE_TEST_REQUIRE_POSTGRES=1 but CREDGATE_TEST_POSTGRES_URL is not set")
        pytest.skip("PostgreSQL tests need CREDGATE_TEST_POSTGRES_URL (the README's test command sets it)")
    return name


BOTH_BACKENDS = pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)


def guarded(settings: Settings, upstream_ports: str = EVERY_PORT) -> Settings:
    """The guard on; every port, unless told: these tests are about addresses (SS-06's have the default list)."""
    return settings.model_copy(update={"allow_private_upstreams": False, "upstream_ports": upstream_ports})


@pytest.fixture
async def guarded_url(settings: Settings, ctx: Context) -> AsyncIterator[str]:
    """The gateway with the guard on; `ctx` keeps it off, so a test can store what the guard would refuse
    (a row written before the guard was turned on, or straight into the database)."""
    async with serving(create_app(guarded(settings), context=ctx), guarded(settings)) as url:
        yield url


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


async def proxied(
    http: httpx.AsyncClient, url: str, project: Project, provider: str, path: str = "x", **headers: str
) -> httpx.Response:
    return await http.get(
        f"{url}/proxy/{provider}/{path}", headers={"Authorization": f"Bearer {project.token}", **headers}
    )


def refusal(response: httpx.Response, provider: str) -> str:
    """The message of a service error, with the provider's name generalised."""
    assert response.headers.get("x-credgate-error") == "true", response.text
    return str(response.json()["error"]["message"]).replace(provider, "{provider}")


@dataclass
class Admin:
    client: httpx.AsyncClient
    project_id: str

    async def save(self, base_url: str, *, token_url: str | None = None, provider: str = "custom") -> httpx.Response:
        body: dict[str, Any] = {"provider": provider, "base_url": base_url, "api_key": "sk-test-ssrf-0000000000"}
        if token_url is not None:
            body["auth"] = {"method": "oauth2_client_credentials", "token_url": token_url, "client_id": "cid"}
        return await self.client.post(f"/api/v1/projects/{self.project_id}/integrations", json=body)


@pytest.fixture
async def admin(client: httpx.AsyncClient, ctx: Context, network: Network) -> Admin:
    """The admin API with the guard on, and api.public.test answering a public address."""
    ctx.allow_private_upstreams = False
    network.answer("api.public.test", ["93.184.216.34"])
    response = await client.post("/api/v1/projects", json={"name": "ssrf"})
    return Admin(client, response.json()["project"]["id"])


async def refusals(admin: Admin, urls: list[str], *, token_urls: bool = False) -> dict[str, tuple[int, str]]:
    """Each URL's save-time answer, as a base URL (or as a token URL): status and message."""
    answers = {}
    for url in urls:
        if token_urls:
            response = await admin.save("https://api.public.test/v1", token_url=url)
        else:
            response = await admin.save(url)
        answers[url] = (response.status_code, response.json().get("error", {}).get("message", ""))
    return answers


# SS-01 and SS-02: every spelling of this machine and of private ranges, at save time and at connect time


@BOTH_BACKENDS
async def test_ss01_loopback_in_every_spelling_is_refused_at_save_time(
    admin: Admin, canary: Canary, network: Network
) -> None:
    urls = [f"https://{host}/v1" for host in LOOPBACK]
    # One generic message, naming the field and never the address.
    assert await refusals(admin, urls) == dict.fromkeys(urls, (422, f"base_url: {NOT_PUBLIC}"))
    assert (canary.hits, network.refused) == (0, [])


@BOTH_BACKENDS
async def test_ss01_a_patch_to_loopback_is_refused_and_leaves_the_base_url_as_it_was(
    admin: Admin, canary: Canary
) -> None:
    assert (await admin.save("https://api.public.test/v1")).status_code == 201
    path = f"/api/v1/projects/{admin.project_id}/integrations/custom"
    response = await admin.client.patch(path, json={"base_url": "https://2130706433/v1"})
    assert (response.status_code, response.json()["error"]["message"]) == (422, f"base_url: {NOT_PUBLIC}")
    assert (await admin.client.get(path)).json()["base_url"] == "https://api.public.test/v1"
    assert canary.hits == 0


async def test_ss01_a_loopback_row_stored_without_the_guard_is_refused_when_connecting(
    guarded_url: str, ctx: Context, project: Project, canary: Canary, network: Network, http: httpx.AsyncClient
) -> None:
    answers = {}
    for index, host in enumerate(LOOPBACK):
        await add_custom(ctx, project, f"loop{index}", f"http://{host}:{canary.port}/v1")
        response = await proxied(http, guarded_url, project, f"loop{index}")
        answers[host] = (response.status_code, refusal(response, f"loop{index}"))
        assert "hidden treasure" not in response.text
    expected = {
        host: (502, REFUSED_BY_ANSWER if host == "127.0.0.1.nip.io" else REFUSED_BY_ADDRESS) for host in LOOPBACK
    }
    assert answers == expected
    assert network.queries == ["127.0.0.1.nip.io"]  # `localhost` is refused by its name, before any lookup
    assert (canary.hits, network.dialed(canary.port), network.refused) == (0, [], [])


@BOTH_BACKENDS
async def test_ss02_private_link_local_metadata_and_translated_ranges_are_refused_at_save_time(
    admin: Admin, canary: Canary, network: Network
) -> None:
    urls = [f"https://{host}/latest" for host in PRIVATE]
    assert await refusals(admin, urls) == dict.fromkeys(urls, (422, f"base_url: {NOT_PUBLIC}"))
    assert (canary.hits, network.refused) == (0, [])


async def test_ss02_a_private_row_stored_without_the_guard_is_refused_before_any_connection(
    guarded_url: str, ctx: Context, project: Project, canary: Canary, network: Network, http: httpx.AsyncClient
) -> None:
    statuses = {}
    for index, host in enumerate(PRIVATE):
        await add_custom(ctx, project, f"inside{index}", f"http://{host}:{canary.port}/latest")
        response = await proxied(http, guarded_url, project, f"inside{index}")
        statuses[host] = (response.status_code, refusal(response, f"inside{index}"))
    assert statuses == dict.fromkeys(PRIVATE, (502, REFUSED_BY_ADDRESS))
    assert (canary.hits, network.refused, network.queries) == (0, [], [])


# SS-03 and SS-04: DNS answers, not strings; the address checked is the address connected to


@BOTH_BACKENDS
async def test_ss03_a_name_answering_any_non_public_address_is_refused_at_save_time(
    admin: Admin, canary: Canary, network: Network
) -> None:
    urls = [f"https://{name}/v1" for name in ANSWERS]
    assert await refusals(admin, urls) == dict.fromkeys(urls, (422, f"base_url: {NOT_PUBLIC}"))
    assert sorted(network.queries) == sorted(ANSWERS)
    assert (canary.hits, network.refused) == (0, [])


async def test_ss03_a_name_answering_any_non_public_address_is_refused_when_connecting(
    guarded_url: str, ctx: Context, project: Project, canary: Canary, network: Network, http: httpx.AsyncClient
) -> None:
    answers = {}
    for index, name in enumerate(ANSWERS):
        await add_custom(ctx, project, f"dns{index}", f"http://{name}:{canary.port}/v1")
        response = await proxied(http, guarded_url, project, f"dns{index}")
        answers[name] = (response.status_code, refusal(response, f"dns{index}"))
    assert answers == dict.fromkeys(ANSWERS, (502, REFUSED_BY_ANSWER))
    # mixed.test's public half was not used either: an answer holding a non-public address is refused whole.
    assert (canary.hits, network.refused) == (0, [])


async def test_ss04_a_rebinding_name_never_reaches_loopback_in_100_requests(
    settings: Settings,
    ctx: Context,
    project: Project,
    canary: Canary,
    network: Network,
    provider: Provider,
    http: httpx.AsyncClient,
) -> None:
    public = network.publish("rebind.test", provider.port)
    network.answer("rebind.test", [public], ["127.0.0.1"])  # TTL 0: public once, loopback ever after
    # The canary's port: a connection to the rebound address would land on it.
    await add_custom(ctx, project, "rebind", f"http://rebind.test:{canary.port}/v1")
    gateway = create_app(guarded(settings), context=ctx)
    statuses = []
    async with serving(gateway, guarded(settings)) as url:
        assert gateway.runtime.proxy is not None
        connections = gateway.runtime.proxy.upstreams.connections
        for _request in range(100):
            statuses.append((await proxied(http, url, project, "rebind")).status_code)
            connections.clear_dns_cache()  # as if the cache's own TTL had run out
    assert statuses == [200] + [502] * 99
    # One lookup per connection, and the connection went where that lookup's checked answer said.
    assert network.queries == ["rebind.test"] * 100
    assert network.dialed(canary.port) == [public]
    assert [seen.path for seen in provider.seen] == ["/v1/x"]
    assert (canary.hits, network.refused) == (0, [])


# SS-05: redirects are relayed, never followed


async def test_ss05_redirects_are_relayed_unchanged_and_never_followed(
    guarded_url: str,
    ctx: Context,
    project: Project,
    canary: Canary,
    network: Network,
    provider: Provider,
    http: httpx.AsyncClient,
) -> None:
    await add_custom(ctx, project, "public", "http://api.public.test/v1")
    targets = [
        f"http://127.0.0.1:{canary.port}/treasure",
        "http://169.254.169.254/latest/meta-data/",
        "http://other.public.test/steal",  # another public host (the same stand-in, under another name)
    ]
    answered = []  # (status, Location, whether it is a service error of credgate's)
    for status in (301, 302, 303, 307, 308):
        for target in targets:
            provider.redirects["/v1/go"] = (status, target)
            response = await proxied(http, guarded_url, project, "public", "go")
            answered.append(
                (response.status_code, response.headers["location"], "x-credgate-error" in response.headers)
            )
    assert answered == [(status, target, False) for status in (301, 302, 303, 307, 308) for target in targets]
    # The key went 15 times to the configured host and path, and nowhere else.
    assert {seen.path for seen in provider.seen} == {"/v1/go"}
    assert len(provider.seen) == 15
    assert all(seen.authorization and seen.authorization.startswith("Bearer ") for seen in provider.seen)
    assert (canary.hits, network.refused) == (0, [])


# SS-06: scheme, userinfo and port.


@BOTH_BACKENDS
async def test_ss06_only_https_without_userinfo_is_accepted(admin: Admin, ctx: Context, canary: Canary) -> None:
    assert await refusals(admin, ["http://api.public.test/v1"]) == {
        "http://api.public.test/v1": (
            422,
            "base_url: must use https (set CREDGATE_ALLOW_PRIVATE_UPSTREAMS for a private upstream)",
        )
    }
    other_schemes = ["file:///etc/passwd", "gopher://api.public.test/", "ftp://api.public.test/", "unix:/run/x.sock"]
    userinfo = ["http://user:s3cr3t-pass@api.public.test/v1", "https://api.public.test@evil.test/v1"]
    for allow_private in (False, True):  # whatever the switch says
        ctx.allow_private_upstreams = allow_private
        answers = await refusals(admin, [*other_schemes, *userinfo, "https://evil.test#@api.public.test/v1"])
        assert {url: status for url, (status, _) in answers.items()} == dict.fromkeys(answers, 422)
        assert {answers[url][1] for url in other_schemes} == {"base_url: must start with http:// or https://"}
        assert {answers[url][1] for url in userinfo} == {"base_url: may not hold credentials; set the API key instead"}
        assert all("s3cr3t" not in message for _, message in answers.values())
    assert canary.hits == 0


# SS-07: each integration lists its own exceptions (private_networks: tests/test_netguard_private_networks.py);
# the process-wide switch CREDGATE_ALLOW_PRIVATE_UPSTREAMS stays, for tests. `credgate serve` warns on the
# terminal and in the log while it is on: tests/e2e/test_ssrf.py::test_serve_says_loudly_when_the_guard_is_off.


@BOTH_BACKENDS
async def test_ss06_a_public_upstream_is_reached_on_an_allowed_port_only(
    admin: Admin, ctx: Context, canary: Canary
) -> None:
    """CREDGATE_UPSTREAM_PORTS, 443 unless told: an SSH or mail server is no provider, for a base URL or a token
    URL alike; the message names the port and the setting, never the host."""
    refused = "port {} is not one a public upstream may use (CREDGATE_UPSTREAM_PORTS: {})"
    ports = {
        "https://api.public.test:22/v1": 22,
        "https://api.public.test:25/v1": 25,
        "https://93.184.216.34:8443/": 8443,
    }
    assert await refusals(admin, list(ports)) == {
        url: (422, "base_url: " + refused.format(port, 443)) for url, port in ports.items()
    }
    assert await refusals(admin, ["https://api.public.test:22/token"], token_urls=True) == {
        "https://api.public.test:22/token": (422, "auth.token_url: " + refused.format(22, 443))
    }
    assert (await admin.save("https://api.public.test:443/v1", provider="default-port")).status_code == 201
    ctx.upstream_ports = frozenset({443, 8443})
    assert (await admin.save("https://api.public.test:8443/v1", provider="listed-port")).status_code == 201
    assert (await admin.save("https://api.public.test:22/v1", provider="ssh")).json()["error"]["message"] == (
        "base_url: " + refused.format(22, "443, 8443")
    )
    ctx.allow_private_upstreams = True  # the switch (tests) lifts every check but the URL's shape
    assert (await admin.save("https://api.public.test:22/v1", provider="switched")).status_code == 201
    assert canary.hits == 0


async def test_ss06_a_row_on_a_port_the_list_no_longer_holds_is_refused_before_any_lookup(
    settings: Settings,
    ctx: Context,
    project: Project,
    canary: Canary,
    network: Network,
    provider: Provider,
    http: httpx.AsyncClient,
) -> None:
    """Saved while the list held its port (or written straight into the database), a row is refused when it is
    used, its base URL or its token URL alike; an integration with exceptions keeps its save-time rule (a listed
    host on any port)."""
    await add_custom(ctx, project, "moved", "https://api.public.test:8443/v1")
    await add_custom(ctx, project, "plain", "http://api.public.test/v1")  # port 80
    await add_custom(
        ctx, project, "ssh", "https://api.public.test/v1", auth=client_credentials("https://api.public.test:22/t")
    )
    await add_custom(ctx, project, "ok", "https://unknown.public.test/v1")
    network.publish("listed.test", provider.port)
    await add_custom(ctx, project, "listed", "http://listed.test:11434/v1", private_networks=["listed.test"])
    async with serving(create_app(guarded(settings, "443"), context=ctx), guarded(settings, "443")) as url:
        answers = {name: await proxied(http, url, project, name) for name in ("moved", "plain", "ssh", "ok", "listed")}
    assert {name: refusal(answer, name) for name, answer in answers.items() if name != "listed"} == {
        "moved": "{provider}'s port 8443 is not in CREDGATE_UPSTREAM_PORTS; refused",
        "plain": "{provider}'s port 80 is not in CREDGATE_UPSTREAM_PORTS; refused",
        "ssh": "{provider}: the token endpoint's port 22 is not in CREDGATE_UPSTREAM_PORTS; refused",
        "ok": "{provider} could not be reached",  # let through: the name answers nothing on the test network
    }
    assert answers["listed"].status_code == 200
    assert [seen.path for seen in provider.seen] == ["/v1/x"]
    assert network.queries == ["listed.test"]
    assert (canary.hits, network.refused) == (0, [])


def test_ss06_the_port_list_is_ports() -> None:
    assert Settings().upstream_port_set == {443}
    assert Settings(upstream_ports="443, 8443").upstream_port_set == {443, 8443}
    for wrong in ("", "443,", "https", "0", "65536", "443;8443"):
        with pytest.raises(ValidationError, match="is not a port"):
            Settings(upstream_ports=wrong)


async def test_ss07_the_guard_is_on_unless_the_switch_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().allow_private_upstreams is False
    monkeypatch.setenv("CREDGATE_ALLOW_PRIVATE_UPSTREAMS", "true")
    assert Settings().allow_private_upstreams is True


async def test_ss07_the_switch_alone_opens_a_stored_loopback_upstream(
    gateway_url: str,
    guarded_url: str,
    ctx: Context,
    project: Project,
    upstream: Upstream,
    canary: Canary,
    http: httpx.AsyncClient,
) -> None:
    await add_custom(ctx, project, "on-prem", upstream.url + "/echo")
    assert (await proxied(http, gateway_url, project, "on-prem")).status_code == 200
    refused = await proxied(http, guarded_url, project, "on-prem")
    assert (refused.status_code, refusal(refused, "on-prem")) == (502, REFUSED_BY_ADDRESS)
    assert [received.path_qs for received in upstream.received] == ["/echo/x"]
    assert canary.hits == 0


# SS-08: no SSRF oracle


async def test_ss08_a_closed_a_silent_and_an_open_internal_port_are_refused_alike(
    guarded_url: str, ctx: Context, project: Project, canary: Canary, network: Network, http: httpx.AsyncClient
) -> None:
    silent_hits = 0

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal silent_hits
        silent_hits += 1
        await asyncio.sleep(5)
        writer.close()

    silent_server = await asyncio.start_server(silent, "127.0.0.1", 0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    ports = {"closed": closed_port, "silent": silent_server.sockets[0].getsockname()[1], "open": canary.port}
    providers = {}
    for state, port in ports.items():
        network.answer(f"{state}.svc.test", ["127.0.0.1"])
        for spelling, host in (("address", "127.0.0.1"), ("name", f"{state}.svc.test")):
            providers[f"{state}-{spelling}"] = spelling
            await add_custom(ctx, project, f"{state}-{spelling}", f"http://{host}:{port}/v1")
    timings: dict[str, list[float]] = {name: [] for name in providers}
    messages: dict[str, set[tuple[int, str]]] = {"address": set(), "name": set()}
    try:
        for _round in range(7):
            for name, spelling in providers.items():
                started = time.perf_counter()
                response = await proxied(http, guarded_url, project, name)
                timings[name].append(time.perf_counter() - started)
                messages[spelling].add((response.status_code, refusal(response, name)))
    finally:
        silent_server.close()
        await silent_server.wait_closed()
    # One refusal whatever the spelling and whatever listens behind it.
    assert messages == {"address": {(502, REFUSED_BY_ADDRESS)}, "name": {(502, REFUSED_BY_ANSWER)}}
    medians = [statistics.median(values) for values in timings.values()]
    assert max(medians) - min(medians) < 0.05, timings
    assert (canary.hits, silent_hits, network.dialed(closed_port), network.refused) == (0, 0, [], [])


async def test_ss08_with_the_guard_off_a_non_http_service_leaks_no_fragment(
    gateway_url: str, ctx: Context, project: Project, canary: Canary, http: httpx.AsyncClient
) -> None:
    banner = b"SSH-2.0-OpenSSH_9.6 internal-build-7f3a\r\n"

    async def ssh(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(banner)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(ssh, "127.0.0.1", 0)
    try:
        await add_custom(ctx, project, "ssh", f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        response = await proxied(http, gateway_url, project, "ssh")
    finally:
        server.close()
    assert (response.status_code, refusal(response, "ssh")) == (502, "{provider} could not be reached")
    assert "OpenSSH" not in response.text
    assert "7f3a" not in response.text
    assert canary.hits == 0


# SS-09: the upstream sees its own host, in the Host header and in TLS, and its certificate is verified


async def test_ss09_the_client_host_never_reaches_the_upstream(
    guarded_url: str,
    ctx: Context,
    project: Project,
    canary: Canary,
    network: Network,
    provider: Provider,
    http: httpx.AsyncClient,
) -> None:
    await add_custom(ctx, project, "public", "http://api.public.test/v1")
    response = await proxied(http, guarded_url, project, "public", Host="internal.test")
    assert response.status_code == 200
    assert [seen.host for seen in provider.seen] == ["api.public.test"]
    assert "internal.test" not in network.queries
    assert (canary.hits, network.refused) == (0, [])


def self_signed(directory: Path, host: str) -> ssl.SSLContext:
    """A server context with a certificate for `host` that no client trusts."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    (directory / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "cert.pem", directory / "key.pem")
    return context


async def test_ss09_tls_names_the_base_urls_host_and_an_unverifiable_certificate_is_a_502(
    guarded_url: str,
    ctx: Context,
    project: Project,
    canary: Canary,
    network: Network,
    tmp_path: Path,
    http: httpx.AsyncClient,
) -> None:
    async with run_provider(self_signed(tmp_path, "api.public.test")) as tls_provider:
        network.publish("api.public.test", tls_provider.port)
        await add_custom(ctx, project, "public", "https://api.public.test/v1")
        response = await proxied(http, guarded_url, project, "public", Host="internal.test")
    assert (response.status_code, refusal(response, "public")) == (502, "{provider} could not be reached")
    assert tls_provider.server_names == ["api.public.test"]
    assert tls_provider.seen == []  # the handshake failed: no request, so no key, was sent
    assert (canary.hits, network.refused) == (0, [])


# SS-10: the OAuth token URL, guarded like a base URL; a token endpoint's redirect is not followed


@BOTH_BACKENDS
async def test_ss10_a_non_public_token_url_is_refused_at_save_time(
    admin: Admin, canary: Canary, network: Network
) -> None:
    urls = [f"https://{host}/token" for host in ["127.0.0.1", "localhost", "[::1]", "169.254.169.254", *ANSWERS]]
    assert await refusals(admin, urls, token_urls=True) == dict.fromkeys(urls, (422, f"auth.token_url: {NOT_PUBLIC}"))
    assert await refusals(admin, ["http://api.public.test/token"], token_urls=True) == {
        "http://api.public.test/token": (
            422,
            "auth.token_url: must use https (set CREDGATE_ALLOW_PRIVATE_UPSTREAMS for a private upstream)",
        )
    }
    assert (await admin.save("https://api.public.test/v1")).status_code == 201
    oauth = {"method": "oauth2_client_credentials", "token_url": "https://0x7f000001/token", "client_id": "cid"}
    response = await admin.client.patch(
        f"/api/v1/projects/{admin.project_id}/integrations/custom", json={"auth": oauth}
    )
    assert (response.status_code, response.json()["error"]["message"]) == (422, f"auth.token_url: {NOT_PUBLIC}")
    assert (canary.hits, network.refused) == (0, [])


def client_credentials(token_url: str) -> OAuth2ClientCredentialsAuth:
    return OAuth2ClientCredentialsAuth(method="oauth2_client_credentials", token_url=token_url, client_id="cid")


async def test_ss10_a_non_public_token_url_stored_without_the_guard_is_refused_when_connecting(
    guarded_url: str,
    ctx: Context,
    project: Project,
    canary: Canary,
    network: Network,
    provider: Provider,
    http: httpx.AsyncClient,
) -> None:
    network.answer("token.rebind.test", ["127.0.0.1"])
    hosts = ["127.0.0.1", "localhost", "[::1]", "2130706433", "token.rebind.test"]
    answers = {}
    for index, host in enumerate(hosts):
        token_url = f"http://{host}:{canary.port}/token"
        await add_custom(ctx, project, f"oauth{index}", "http://api.public.test/v1", auth=client_credentials(token_url))
        response = await proxied(http, guarded_url, project, f"oauth{index}")
        answers[host] = (response.status_code, refusal(response, f"oauth{index}"))
    refused_by_address = (502, "{provider}: the token endpoint's address is not public; refused")
    assert answers == dict.fromkeys(hosts, refused_by_address)
    assert provider.seen == []  # without a token, the API call is not made either
    assert (canary.hits, network.refused) == (0, [])


async def test_ss10_a_token_endpoints_redirect_is_not_followed(
    guarded_url: str,
    ctx: Context,
    project: Project,
    canary: Canary,
    network: Network,
    provider: Provider,
    http: httpx.AsyncClient,
) -> None:
    targets = [f"http://127.0.0.1:{canary.port}/token", "http://other.public.test/steal"]
    for index, target in enumerate(targets):
        provider.redirects[f"/token{index}"] = (307, target)
        auth = client_credentials(f"http://auth.public.test/token{index}")
        await add_custom(ctx, project, f"oauth{index}", "http://api.public.test/v1", auth=auth)
        response = await proxied(http, guarded_url, project, f"oauth{index}")
        assert (response.status_code, refusal(response, f"oauth{index}")) == (
            502,
            "{provider}: the token endpoint refused the credentials (status 307)",
        )
    # The client secret went to the token endpoint only, once per integration.
    assert [(seen.path, seen.host) for seen in provider.seen] == [
        ("/token0", "auth.public.test"),
        ("/token1", "auth.public.test"),
    ]
    assert all(seen.authorization and seen.authorization.startswith("Basic ") for seen in provider.seen)
    assert (canary.hits, network.refused) == (0, [])


async def test_ss10_webhooks_and_identity_providers_keys_reach_public_addresses_only(
    settings: Settings, ctx: Context, canary: Canary, network: Network
) -> None:
    """Webhooks and identity providers' keys (JWKS) go through the guard as proxied requests do: a loopback URL in
    any spelling, or a name that resolves to loopback when the call is made, never reaches the canary."""
    network.answer("hooks.rebind.test", ["127.0.0.1"])
    hosts = ("127.0.0.1", "[::1]", "2130706433", "127.0.0.2", "hooks.rebind.test")
    gateway = create_app(guarded(settings), context=ctx)
    async with serving(gateway, guarded(settings)):
        proxy = gateway.proxy
        assert proxy is not None
        for host in hosts:
            url = f"http://{host}:{canary.port}/hook"
            with pytest.raises(NonPublicAddress):
                await proxy.post_event(url, b"{}", [("Content-Type", "application/json")])
            with pytest.raises(NonPublicAddress):
                await proxy._fetch_keys(url)
    assert network.queries == ["hooks.rebind.test", "hooks.rebind.test"]  # judged by its answer, at each call
    assert (canary.hits, network.refused) == (0, [])
