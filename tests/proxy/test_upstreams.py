"""The outbound sessions of integrations' exceptions: one per distinct list, the shared public-only one otherwise,
bounded in number, and never closed under a response in flight."""

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver
from yarl import URL

from credgate.netguard import NO_PRIVATE_NETWORKS, PrivateNetworks
from credgate.proxy import create_http_session
from credgate.proxy import upstreams as upstreams_module
from credgate.proxy.guard import NonPublicAddress, PrivateNetworksResolver, PublicOnlyResolver
from credgate.proxy.upstreams import Upstreams

LOOPBACK = PrivateNetworks.of(["127.0.0.1"])
VPC = PrivateNetworks.of(["10.0.0.0/8"])
GPU = PrivateNetworks.of(["gpu-box"])


def open_session(resolver: AbstractResolver) -> aiohttp.ClientSession:
    return create_http_session(allow_private_upstreams=False, resolver=resolver)


@pytest.fixture
async def default() -> AsyncIterator[aiohttp.ClientSession]:
    session = create_http_session(allow_private_upstreams=False)
    yield session
    await session.close()


@pytest.fixture
async def registry(default: aiohttp.ClientSession) -> AsyncIterator[Upstreams]:
    upstreams = Upstreams(default, allow_private=False, open_session=open_session, max_sessions=2)
    yield upstreams
    await upstreams.close()


async def test_an_integration_without_exceptions_gets_the_shared_public_only_session(
    registry: Upstreams, default: aiohttp.ClientSession
) -> None:
    assert registry.session_for(NO_PRIVATE_NETWORKS) is default
    assert registry.exception_sessions == 0


async def test_every_session_verifies_tls_with_the_one_context_of_the_process(
    registry: Upstreams, default: aiohttp.ClientSession
) -> None:
    contexts = {id(session.connector._ssl) for session in (default, registry.session_for(VPC))}  # type: ignore[union-attr]
    assert len(contexts) == 1  # no session loads the CA certificates again (40 ms of the loop each)
    context = default.connector._ssl  # type: ignore[union-attr]
    assert isinstance(context, ssl.SSLContext)
    assert (context.verify_mode, context.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert not context.keylog_filename  # SSLKEYLOGFILE is not read


async def test_each_distinct_list_gets_a_session_of_its_own_whose_resolver_admits_that_list(
    registry: Upstreams, default: aiohttp.ClientSession
) -> None:
    loopback = registry.session_for(LOOPBACK)
    assert registry.session_for(PrivateNetworks.of(["127.0.0.1/32"])) is loopback  # the same list
    vpc = registry.session_for(VPC)
    assert len({id(default), id(loopback), id(vpc)}) == 3
    assert isinstance(loopback.connector, aiohttp.TCPConnector)
    resolver = loopback.connector._resolver
    assert isinstance(resolver, PrivateNetworksResolver)
    assert resolver._exceptions == LOOPBACK


async def test_with_the_switch_on_everything_shares_one_session(default: aiohttp.ClientSession) -> None:
    registry = Upstreams(default, allow_private=True, open_session=open_session)
    assert registry.session_for(LOOPBACK) is default
    assert not registry.refuses("http://169.254.169.254/latest", NO_PRIVATE_NETWORKS)


async def test_a_literal_address_is_refused_by_its_spelling_within_the_integrations_exceptions(
    registry: Upstreams,
) -> None:
    assert registry.refuses("http://127.0.0.1:11434/v1", NO_PRIVATE_NETWORKS)
    assert not registry.refuses("http://127.0.0.1:11434/v1", LOOPBACK)
    assert registry.refuses("http://127.0.0.1:11434/v1", VPC)
    assert registry.refuses("http://127.0.0.2:11434/v1", LOOPBACK)
    assert not registry.refuses("http://gpu-box:8000/v1", GPU)
    assert registry.refuses("http://gpu-box:8000/v1", NO_PRIVATE_NETWORKS)


async def test_beyond_the_bound_the_least_recently_used_session_is_closed(
    registry: Upstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upstreams_module, "_IDLE_CHECK_SECONDS", 0.01)
    loopback = registry.session_for(LOOPBACK)
    vpc = registry.session_for(VPC)
    registry.session_for(LOOPBACK)  # used again: VPC is now the least recently used
    registry.session_for(GPU)
    await asyncio.sleep(0.05)
    assert (vpc.closed, loopback.closed, registry.exception_sessions) == (True, False, 2)
    again = registry.session_for(VPC)  # opened anew when needed again
    assert again is not vpc
    assert not again.closed


async def test_a_retired_session_stays_open_until_its_response_in_flight_is_done(
    registry: Upstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upstreams_module, "_IDLE_CHECK_SECONDS", 0.01)
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"first")
        await release.wait()
        await response.write(b" last")
        return response

    app = web.Application()
    app.router.add_get("/stream", slow)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        session = registry.session_for(LOOPBACK)
        response = await session.get(f"http://127.0.0.1:{runner.addresses[0][1]}/stream")
        assert await response.content.readexactly(5) == b"first"
        registry.session_for(VPC)
        registry.session_for(GPU)  # LOOPBACK is retired, its response still streaming
        await asyncio.sleep(0.05)
        assert not session.closed
        release.set()
        assert await response.read() == b" last"
        response.release()
        await asyncio.sleep(0.05)
        assert session.closed
    finally:
        await runner.cleanup()


async def test_closing_closes_every_session_of_exceptions_and_not_the_shared_one(
    default: aiohttp.ClientSession,
) -> None:
    registry = Upstreams(default, allow_private=False, open_session=open_session, max_sessions=1)
    sessions = [registry.session_for(LOOPBACK), registry.session_for(VPC)]  # the first is being retired
    await registry.close()
    assert all(session.closed for session in sessions)
    assert not default.closed
    assert registry.exception_sessions == 0


async def test_the_proxys_pools_follow_the_sessions_rule_one_per_distinct_list(registry: Upstreams) -> None:
    assert registry.connections_for(NO_PRIVATE_NETWORKS) is registry.connections
    loopback = registry.connections_for(LOOPBACK)
    assert registry.connections_for(PrivateNetworks.of(["127.0.0.1/32"])) is loopback  # the same list
    assert loopback is not registry.connections_for(VPC)
    assert isinstance(loopback._resolver, PrivateNetworksResolver)
    assert loopback._resolver._exceptions == LOOPBACK
    assert isinstance(registry.connections._resolver, PublicOnlyResolver)


async def test_a_retired_pool_lets_its_response_in_flight_end_and_then_closes_its_connection(
    registry: Upstreams,
) -> None:
    release = asyncio.Event()
    closed = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nfirst")
        await release.wait()
        writer.write(b" last")
        await reader.read()  # until the gateway's side closes
        closed.set()
        writer.close()

    server = await asyncio.start_server(slow, "127.0.0.1", 0)
    try:
        pool = registry.connections_for(LOOPBACK)
        url = URL(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/stream")
        response = await pool.request("GET", url, [])
        assert await response.read_any() == b"first"
        registry.connections_for(VPC)
        registry.connections_for(GPU)  # LOOPBACK's pool is retired, its response still streaming
        assert registry.connections_for(LOOPBACK) is not pool  # a new one, when needed again
        release.set()
        assert await response.read() == b" last"
        response.release()
        await asyncio.wait_for(closed.wait(), 5)  # not kept for reuse: its pool is retired
    finally:
        server.close()
        await server.wait_closed()


async def test_the_resolver_refuses_an_answer_outside_the_list(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    answers = {
        "gpu-box": ["127.0.0.1"],
        "vpc.test": ["10.0.0.5"],
        "meta.test": ["169.254.169.254"],
        "other.test": ["127.0.0.1"],
        "mixed.test": ["10.0.0.5", "127.0.0.1"],
    }

    async def getaddrinfo(host: str, port: int, **_options: object) -> list[object]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in answers[host]]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    resolver = PrivateNetworksResolver(PrivateNetworks.of(["gpu-box", "meta.test", "10.0.0.0/8"]))
    try:
        assert [found["host"] for found in await resolver.resolve("gpu-box", 80)] == ["127.0.0.1"]
        assert [found["host"] for found in await resolver.resolve("vpc.test", 80)] == ["10.0.0.5"]
        for refused in ("meta.test", "other.test", "mixed.test"):  # listed yet link-local; loopback; half of it
            with pytest.raises(NonPublicAddress):
                await resolver.resolve(refused, 80)
        answers["gpu-box"] = ["169.254.1.1"]  # a listed name that rebinds to link-local
        with pytest.raises(NonPublicAddress):
            await resolver.resolve("gpu-box", 80)
    finally:
        await resolver.close()
