"""The upstream client's pools: one per distinct list of an integration's exceptions, the shared public-only one
otherwise, bounded in number, and a retired one never closed under a response in flight."""

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator

import pytest
from yarl import URL

from credgate.netguard import NO_PRIVATE_NETWORKS, PrivateNetworks
from credgate.proxy.guard import NonPublicAddress, PrivateNetworksResolver, PublicOnlyResolver, SystemResolver
from credgate.proxy.upstreams import Upstreams

LOOPBACK = PrivateNetworks.of(["127.0.0.1"])
VPC = PrivateNetworks.of(["10.0.0.0/8"])
GPU = PrivateNetworks.of(["gpu-box"])


@pytest.fixture
async def registry() -> AsyncIterator[Upstreams]:
    upstreams = Upstreams(allow_private=False, max_pools=2)
    yield upstreams
    await upstreams.close()


async def test_an_integration_without_exceptions_gets_the_shared_public_only_pool(registry: Upstreams) -> None:
    assert registry.connections_for(NO_PRIVATE_NETWORKS) is registry.connections
    assert isinstance(registry.connections.resolver, PublicOnlyResolver)
    assert registry.exception_pools == 0


async def test_the_gateways_own_calls_have_a_public_only_pool_apart_except_for_an_integrations_exceptions(
    registry: Upstreams,
) -> None:
    """A proxy at its connection limit (a thousand streams open) must not hold up a token fetch, an identity
    provider's keys or a webhook; a token fetch of an integration with exceptions goes through its list's pool."""
    assert registry.own_calls is not registry.connections
    assert isinstance(registry.own_calls.resolver, PublicOnlyResolver)
    assert registry.own_calls_for(NO_PRIVATE_NETWORKS) is registry.own_calls
    assert registry.own_calls_for(LOOPBACK) is registry.connections_for(LOOPBACK)


async def test_every_pool_verifies_tls_with_the_one_context_of_the_process(registry: Upstreams) -> None:
    contexts = {id(pool._tls) for pool in (registry.connections, registry.connections_for(VPC))}
    assert len(contexts) == 1  # no pool loads the CA certificates again (40 ms of the loop each)
    context = registry.connections._tls
    assert (context.verify_mode, context.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert not context.keylog_filename  # SSLKEYLOGFILE is not read


async def test_each_distinct_list_gets_a_pool_of_its_own_whose_resolver_admits_that_list(registry: Upstreams) -> None:
    loopback = registry.connections_for(LOOPBACK)
    assert registry.connections_for(PrivateNetworks.of(["127.0.0.1/32"])) is loopback  # the same list
    vpc = registry.connections_for(VPC)
    assert len({id(registry.connections), id(loopback), id(vpc)}) == 3
    assert isinstance(loopback.resolver, PrivateNetworksResolver)
    assert loopback.resolver.exceptions == LOOPBACK
    assert registry.exception_pools == 2


async def test_with_the_switch_on_everything_shares_one_pool_that_dials_any_address() -> None:
    registry = Upstreams(allow_private=True)
    try:
        assert registry.connections_for(LOOPBACK) is registry.connections
        assert registry.own_calls_for(LOOPBACK) is registry.own_calls
        assert type(registry.connections.resolver) is type(registry.own_calls.resolver) is SystemResolver
        assert not registry.refuses("http://169.254.169.254/latest", NO_PRIVATE_NETWORKS)
    finally:
        await registry.close()


async def test_a_literal_address_is_refused_by_its_spelling_within_the_integrations_exceptions(
    registry: Upstreams,
) -> None:
    assert registry.refuses("http://127.0.0.1:11434/v1", NO_PRIVATE_NETWORKS)
    assert not registry.refuses("http://127.0.0.1:11434/v1", LOOPBACK)
    assert registry.refuses("http://127.0.0.1:11434/v1", VPC)
    assert registry.refuses("http://127.0.0.2:11434/v1", LOOPBACK)
    assert not registry.refuses("http://gpu-box:8000/v1", GPU)
    assert registry.refuses("http://gpu-box:8000/v1", NO_PRIVATE_NETWORKS)


async def test_beyond_the_bound_the_least_recently_used_pool_is_retired_and_opened_anew_when_needed(
    registry: Upstreams,
) -> None:
    loopback = registry.connections_for(LOOPBACK)
    vpc = registry.connections_for(VPC)
    registry.connections_for(LOOPBACK)  # used again: VPC is now the least recently used
    registry.connections_for(GPU)
    assert (vpc.closed, loopback.closed, registry.exception_pools) == (True, False, 2)
    again = registry.connections_for(VPC)
    assert again is not vpc
    assert not again.closed


async def test_closing_closes_every_pool(registry: Upstreams) -> None:
    pools = [
        registry.connections,
        registry.own_calls,
        registry.connections_for(LOOPBACK),
        registry.connections_for(VPC),
    ]
    await registry.close()
    assert all(pool.closed for pool in pools)
    assert registry.exception_pools == 0


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
    assert await resolver.resolve("gpu-box", 80) == [("127.0.0.1", socket.AF_INET)]
    assert await resolver.resolve("vpc.test", 80) == [("10.0.0.5", socket.AF_INET)]
    for refused in ("meta.test", "other.test", "mixed.test"):  # listed yet link-local; loopback; half of it
        with pytest.raises(NonPublicAddress):
            await resolver.resolve(refused, 80)
    answers["gpu-box"] = ["169.254.1.1"]  # a listed name that rebinds to link-local
    with pytest.raises(NonPublicAddress):
        await resolver.resolve("gpu-box", 80)
