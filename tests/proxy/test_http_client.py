"""The proxy's upstream client against a scripted upstream on a real socket: what it writes, how it reads each
framing of a response, when it keeps a connection and when it drops one, and its bounds."""

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from yarl import URL

from credgate.netguard import PrivateNetworks
from credgate.proxy import http_client
from credgate.proxy.guard import Address, NonPublicAddress, PrivateNetworksResolver, PublicOnlyResolver, SystemResolver
from credgate.proxy.http_client import (
    Connections,
    UpstreamClosed,
    UpstreamFraming,
    UpstreamResponse,
    request_head,
)
from credgate.proxy.upstreams import tls_context

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
Script = Callable[[bytes], bytes | None]  # a request's bytes -> what the upstream answers (None: it hangs up)


class Upstream:
    """A raw upstream: each request (head and body, as framed by Content-Length) gets the script's answer, after
    which it closes the connection if `close_after` says so; it records what it received and how many connections
    it accepted and closed."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.close_after = False
        self.requests: list[bytes] = []
        self.connections = 0
        self.closed = 0
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                if b"transfer-encoding: chunked" in head.lower():
                    body = await reader.readuntil(b"0\r\n\r\n")
                self.requests.append(head + body)
                answer = self.script(head + body)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            self.writers.discard(writer)
            writer.close()


@pytest.fixture
async def pool() -> AsyncIterator[Connections]:
    connections = Connections(SystemResolver(), tls=tls_context())
    yield connections
    await connections.close()


Serve = Callable[[Script], Awaitable[tuple[Upstream, URL]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start scripted upstreams (the upstream and the URL to call it at); all are closed after the test."""
    started: list[Upstream] = []

    async def start(script: Script) -> tuple[Upstream, URL]:
        upstream = Upstream(script)
        started.append(upstream)
        return upstream, URL(await upstream.start() + "/v1/chat")

    yield start
    for upstream in started:
        await upstream.stop()


async def body_of(response: UpstreamResponse) -> bytes:
    try:
        return await response.read()
    finally:
        response.release()


# what it writes


def test_the_head_carries_host_the_given_headers_in_order_and_the_bodys_length() -> None:
    head, chunked = request_head(
        "POST",
        URL("http://api.example:8080/v1/x?a=%2F", encoded=True),
        [("Authorization", "Bearer k"), ("X-A", "1")],
        b"{}",
    )
    assert head == (
        b"POST /v1/x?a=%2F HTTP/1.1\r\nHost: api.example:8080\r\nAuthorization: Bearer k\r\nX-A: 1\r\n"
        b"Content-Length: 2\r\n\r\n"
    )
    assert not chunked


def test_a_bodiless_post_says_length_0_and_a_get_says_nothing() -> None:
    post, _ = request_head("POST", URL("https://api.example/x"), [], None)
    get, _ = request_head("GET", URL("https://api.example/x"), [], None)
    assert post == b"POST /x HTTP/1.1\r\nHost: api.example\r\nContent-Length: 0\r\n\r\n"
    assert get == b"GET /x HTTP/1.1\r\nHost: api.example\r\n\r\n"


async def test_a_streamed_body_of_unknown_length_goes_chunked_and_one_of_known_length_as_it_is() -> None:
    async def pieces() -> AsyncIterator[bytes]:
        yield b"ab"

    unknown, chunked = request_head("PUT", URL("http://h/x"), [], pieces())
    known, plain = request_head("PUT", URL("http://h/x"), [("Content-Length", "2")], pieces())
    assert (chunked, unknown.count(b"Transfer-Encoding: chunked\r\n")) == (True, 1)
    assert (plain, known.count(b"Transfer-Encoding"), known.count(b"Content-Length")) == (False, 0, 1)


@pytest.mark.parametrize("header", [("X-A", "1\r\nX-Injected: 1"), ("X-A\n", "1"), ("X-A", "1\r")])
def test_a_header_with_a_line_break_is_refused(header: tuple[str, str]) -> None:
    with pytest.raises(ValueError, match="line break"):
        request_head("GET", URL("http://h/x"), [header], None)


def test_a_client_headers_latin_1_bytes_go_up_as_they_came() -> None:
    head, _ = request_head("GET", URL("http://h/x"), [("X-Name", b"caf\xe9".decode("latin-1"))], None)
    assert b"X-Name: caf\xe9\r\n" in head


async def test_the_upstream_receives_the_request_in_one_piece_and_the_connection_is_kept(
    pool: Connections, serve: Serve
) -> None:
    upstream, url = await serve(lambda _request: OK)
    for _ in range(3):
        response = await pool.request("POST", url, [("Content-Type", "application/json")], b'{"a":1}')
        assert (response.status, await body_of(response)) == (200, b"{}")
    assert upstream.connections == 1
    assert upstream.requests[0].endswith(b'Content-Length: 7\r\n\r\n{"a":1}')


async def test_a_streamed_body_reaches_the_upstream_whole(pool: Connections, serve: Serve) -> None:
    upstream, url = await serve(lambda _request: OK)

    async def pieces() -> AsyncIterator[bytes]:
        for piece in (b"one,", b"", b"two"):
            yield piece

    assert await body_of(await pool.request("POST", url, [], pieces())) == b"{}"
    assert upstream.requests[0].endswith(b"4\r\none,\r\n3\r\ntwo\r\n0\r\n\r\n")


# how it reads


async def test_a_header_is_found_in_any_case_with_its_first_value_and_the_headers_stay_as_sent(
    pool: Connections, serve: Serve
) -> None:
    answer = (
        b"HTTP/1.1 103 Early Hints\r\nRetry-After: 9\r\n\r\n"
        b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 20\r\nX-Ratelimit: a\r\nx-ratelimit: b\r\n"
        b"content-length: 0\r\n\r\n"
    )
    _upstream, url = await serve(lambda _request: answer)
    response = await pool.request("GET", url, [])
    await body_of(response)
    assert (response.header("retry-after"), response.header("X-RATELIMIT"), response.header("Link")) == (
        "20",
        "a",
        None,
    )
    assert response.raw_headers == [
        (b"Retry-After", b"20"),
        (b"X-Ratelimit", b"a"),
        (b"x-ratelimit", b"b"),
        (b"content-length", b"0"),
    ]


@pytest.mark.parametrize(
    ("answer", "body"),
    [
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", b"abcde"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + OK, b"{}"),
    ],
)
async def test_each_framing_of_a_response_is_read_to_its_end(
    pool: Connections, answer: bytes, body: bytes, serve: Serve
) -> None:
    _upstream, url = await serve(lambda _request: answer)
    response = await pool.request("GET", url, [])
    assert await body_of(response) == body
    assert [name for name, _ in response.raw_headers if name == b"link"] == []  # an interim head is not kept


async def test_a_body_that_ends_with_the_connection_is_complete_at_its_close(pool: Connections, serve: Serve) -> None:
    upstream, url = await serve(lambda _request: b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
    upstream.close_after = True
    assert await asyncio.wait_for(body_of(await pool.request("GET", url, [])), 5) == b"until the end"


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n7\r\npartial\r\n",
    ],
)
async def test_a_body_cut_short_of_its_framing_is_an_error_not_an_end(
    pool: Connections, answer: bytes, serve: Serve
) -> None:
    upstream, url = await serve(lambda _request: answer)
    upstream.close_after = True
    response = await pool.request("GET", url, [])
    with pytest.raises(UpstreamClosed):
        await asyncio.wait_for(response.read(), 5)
    assert not response.is_eof()
    response.release()


async def test_broken_framing_is_an_error_of_its_own(pool: Connections, serve: Serve) -> None:
    _upstream, url = await serve(lambda _request: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")
    response = await pool.request("GET", url, [])
    with pytest.raises(UpstreamFraming):
        await response.read()
    response.release()


async def test_a_head_response_ends_with_its_headers_and_its_connection_is_not_reused(
    pool: Connections, serve: Serve
) -> None:
    upstream, url = await serve(lambda _request: b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
    for _ in range(2):
        response = await asyncio.wait_for(pool.request("HEAD", url, []), 5)
        assert (response.status, response.header("Content-Length"), await body_of(response)) == (200, "1000", b"")
    assert upstream.connections == 2


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (http_client.MAX_HEAD_BYTES + 1) + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"x-many: 1\r\n" * (http_client.MAX_HEADERS + 1) + b"\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
    ],
    ids=["head too long", "too many headers", "not HTTP"],
)
async def test_a_head_over_the_bounds_or_not_http_drops_the_connection(
    pool: Connections, head: bytes, serve: Serve
) -> None:
    upstream, url = await serve(lambda _request: head)
    with pytest.raises(UpstreamFraming):
        await pool.request("GET", url, [])
    assert pool.in_use == 0
    assert upstream.connections == 1


async def test_bytes_past_the_response_end_the_connection_and_never_answer_the_next_request(
    pool: Connections, serve: Serve
) -> None:
    smuggled = b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nplanted"
    upstream, url = await serve(lambda _request: OK + smuggled)
    first = await pool.request("GET", url, [])
    assert (first.status, await body_of(first)) == (200, b"{}")  # the response itself is whole
    upstream.script = lambda _request: b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nhonest"
    assert await body_of(await pool.request("GET", url, [])) == b"honest"
    assert upstream.connections == 2


async def test_a_response_released_before_its_end_closes_its_connection(pool: Connections, serve: Serve) -> None:
    upstream, url = await serve(lambda _request: b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf")
    response = await pool.request("GET", url, [])
    response.release()
    upstream.script = lambda _request: OK
    assert await body_of(await pool.request("GET", url, [])) == b"{}"
    assert upstream.connections == 2  # the rest of the first body would have been read as the second response


async def test_a_wait_cut_short_closes_the_connection_it_was_made_on(pool: Connections, serve: Serve) -> None:
    upstream, url = await serve(lambda _request: b"")  # answers nothing
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pool.request("GET", url, []), 0.2)
    await asyncio.sleep(0.1)
    assert (pool.in_use, upstream.closed) == (0, 1)


async def test_a_connection_the_upstream_closed_while_idle_is_not_used_again(pool: Connections, serve: Serve) -> None:
    upstream, url = await serve(lambda _request: OK)
    upstream.close_after = True  # after its answer, with no word of it (no Connection: close)
    assert await body_of(await pool.request("GET", url, [])) == b"{}"
    await asyncio.sleep(0.1)  # the upstream's close arrives
    assert await body_of(await pool.request("GET", url, [])) == b"{}"
    assert upstream.connections == 2


async def test_the_upstream_waits_while_the_relay_has_not_taken_what_arrived(pool: Connections, serve: Serve) -> None:
    big = b"x" * (4 * http_client.PAUSE_READING_BYTES)
    _upstream, url = await serve(lambda _request: b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(big), big))
    response = await pool.request("GET", url, [])
    await asyncio.sleep(0.2)  # the upstream has written all it could
    buffered = response._buffered
    assert buffered < 2 * http_client.PAUSE_READING_BYTES
    assert await body_of(response) == big


# bounds


async def test_requests_beyond_the_limit_wait_for_a_connection_to_be_released(serve: Serve) -> None:
    pool = Connections(SystemResolver(), tls=tls_context(), limit=1)
    upstream, url = await serve(lambda _request: OK)
    try:
        first = await pool.request("GET", url, [])
        second = asyncio.ensure_future(pool.request("GET", url, []))
        await asyncio.sleep(0.1)
        assert not second.done()
        assert await body_of(first) == b"{}"
        assert await body_of(await asyncio.wait_for(second, 5)) == b"{}"
        assert upstream.connections == 1
    finally:
        await pool.close()


class SlowAnswers:
    """Answers 127.0.0.1 after a while: requests connecting at once all wait on the resolver together."""

    async def resolve(self, host: str, port: int) -> list[Address]:
        await asyncio.sleep(0.1)
        return [("127.0.0.1", socket.AF_INET)]

    def admits(self, address: str) -> bool:
        return True


async def test_requests_connecting_at_once_keep_the_limit(serve: Serve) -> None:
    """A connection takes its place in the limit before it waits on the resolver or the dial, not once open."""
    pool = Connections(SlowAnswers(), tls=tls_context(), limit=2)
    upstream, url = await serve(lambda _request: OK)
    try:
        requests = [asyncio.ensure_future(pool.request("GET", url.with_host("upstream.test"), [])) for _ in range(5)]
        await asyncio.sleep(0.3)
        assert sum(request.done() for request in requests) == 2
        assert pool.in_use == 2
        for request in requests:
            assert await body_of(await asyncio.wait_for(request, 5)) == b"{}"
        assert upstream.connections == 2
    finally:
        await pool.close()


async def test_a_name_that_resolves_to_a_private_address_is_refused_by_the_public_resolver() -> None:
    pool = Connections(PublicOnlyResolver(), tls=tls_context())
    try:
        with pytest.raises(NonPublicAddress):
            await pool.request("GET", URL("http://localhost:1/x"), [])
    finally:
        await pool.close()


async def test_a_literal_address_is_judged_by_the_pools_guard_too(serve: Serve) -> None:
    """The proxy refuses a URL by its spelling before it calls (Upstreams.refuses); the pool checks again, so that
    a caller that forgot cannot dial a private address."""
    _, url = await serve(lambda _request: OK)
    public = Connections(PublicOnlyResolver(), tls=tls_context())
    listed = Connections(PrivateNetworksResolver(PrivateNetworks.of(["127.0.0.1"])), tls=tls_context())
    try:
        for refused in (url, url.with_host("169.254.169.254"), URL(f"http://[::1]:{url.port}/x")):
            with pytest.raises(NonPublicAddress):
                await public.request("GET", refused, [])
        assert await body_of(await listed.request("GET", url, [])) == b"{}"
        with pytest.raises(NonPublicAddress):
            await listed.request("GET", url.with_host("127.0.0.2"), [])
    finally:
        await public.close()
        await listed.close()


async def test_an_ipv6_literals_scope_is_read_as_a_url_spells_it() -> None:
    """RFC 6874: the scope's % is spelt %25 in a URL (the literal reaches the pool as yarl's raw host)."""
    pool = Connections(SystemResolver(), tls=tls_context())
    for spelt, address in (("fe80::1%25eth0", "fe80::1%eth0"), ("fe80::1%254", "fe80::1%4"), ("::1", "::1")):
        url = URL(f"http://[{spelt}]:8080/v1", encoded=True)
        assert await pool._addresses(url.raw_host or "", 8080) == [(address, socket.AF_INET6)]


class Answers:
    def __init__(self, *addresses: Address) -> None:
        self.addresses = list(addresses)

    async def resolve(self, host: str, port: int) -> list[Address]:
        return self.addresses

    def admits(self, address: str) -> bool:
        return True


async def test_an_address_that_never_answers_costs_a_fraction_of_a_second_not_the_connect_timeout(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name's first address silently dropped (an IPv6 route that goes nowhere, say): the next is tried 0.25 s
    later (Happy Eyeballs), where trying them in turn would wait out the 30 s connect timeout."""
    _, url = await serve(lambda _request: OK)
    loop = asyncio.get_running_loop()
    dialled: list[str] = []
    sock_connect = loop.sock_connect

    async def black_hole_for_127_0_0_2(sock: socket.socket, address: tuple[str, int]) -> None:
        dialled.append(address[0])
        if address[0] == "127.0.0.2":
            await asyncio.Event().wait()  # never answers
        await sock_connect(sock, address)

    monkeypatch.setattr(loop, "sock_connect", black_hole_for_127_0_0_2)
    pool = Connections(Answers(("127.0.0.2", socket.AF_INET), ("127.0.0.1", socket.AF_INET)), tls=tls_context())
    try:
        response = await asyncio.wait_for(pool.request("GET", url.with_host("upstream.test"), []), 5)
        assert await body_of(response) == b"{}"
        assert dialled == ["127.0.0.2", "127.0.0.1"]
    finally:
        await pool.close()


async def test_a_bounded_read_refuses_a_body_over_its_limit(pool: Connections, serve: Serve) -> None:
    big = b"x" * 300_000
    _, url = await serve(lambda _request: b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(big), big))
    response = await pool.request("GET", url, [])
    try:
        with pytest.raises(ValueError, match="over 100000 bytes"):
            await response.read(limit=100_000)
    finally:
        response.release()
    assert await body_of(await pool.request("GET", url, [])) == big  # under the limit: read whole


async def test_an_unreachable_upstream_is_a_connection_error(pool: Connections) -> None:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(ConnectionRefusedError):
            await pool.request("GET", URL(f"http://127.0.0.1:{port}/x"), [])
    assert pool.in_use == 0
