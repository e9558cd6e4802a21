"""Catalogue group FT: faults of the upstream, the client and the gateway's own dependencies.

Timeouts are scaled down through the settings and the integration's fields; a figure the catalogue gives (5 s,
300 s) is checked at the scaled value. Where an end-to-end test already asserts an item's pass criterion, the
item's test here says which one and asserts only what is missing.
"""

import asyncio
import contextlib
import gzip
import itertools
import secrets
import signal
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy.engine import make_url

from credgate.app import Gateway, create_app
from credgate.config import Settings
from credgate.proxy import ProxyApp, oauth
from credgate.services import admins, integrations, projects
from credgate.services.access import LOOKUP_TIMEOUT_SECONDS
from credgate.services.bootstrap import open_context
from credgate.services.context import Context
from credgate.specs import Endpoint, OAuth2ClientCredentialsAuth
from tests.conftest import POSTGRES_URL, REQUIRE_POSTGRES
from tests.e2e.conftest import (
    Project,
    add_custom,
    add_project,
    bearer,
    free_port,
    serving,
    start_gateway,
    stop_gateway,
)
from tests.polling import eventually
from tests.secret_sweep import SWEEP
from tests.upstream import (
    GZIP_EVENTS,
    FaultRelay,
    TokenEndpoint,
    Upstream,
    run_catalogue_upstream,
    run_fault_relay,
    run_raw_upstream,
    run_token_endpoint,
    run_watched_upstream,
)

# A scaled timeout must fire at its value, and within this much after it (the catalogue allows 10 %, at least
# 200 ms; a loaded 2-core CI machine needs more).
LATE = 0.4
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
ENVELOPE_HEADER = "x-credgate-error"
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def assert_service_error(response: httpx.Response, status: int) -> str:
    """The contract's envelope with `status`; returns its message."""
    assert response.status_code == status, response.text
    assert response.headers[ENVELOPE_HEADER] == "true"
    body = response.json()
    assert body == {"error": {"status": status, "message": body["error"]["message"]}}
    return str(body["error"]["message"])


@dataclass
class Served:
    """The gateway under uvicorn in this loop, with its proxy at hand (in-flight count) and a client."""

    app: Gateway
    url: str
    http: httpx.AsyncClient

    @property
    def proxy(self) -> ProxyApp:
        assert isinstance(self.app.proxy, ProxyApp)
        return self.app.proxy

    async def get(self, path: str, token: str) -> httpx.Response:
        return await self.http.get(f"{self.url}{path}", headers=bearer(token))


async def get_504_at(served: Served, path: str, token: str, seconds: float) -> float:
    """GET `path` through the gateway: it must be a 504 that took `seconds`, give or take LATE. Returns when the
    request was sent."""
    started = time.monotonic()
    response = await served.get(path, token)
    assert_service_error(response, 504)
    assert seconds <= time.monotonic() - started < seconds + LATE
    return started


@pytest.fixture
async def served(settings: Settings, ctx: Context) -> AsyncIterator[Served]:
    app = create_app(settings, context=ctx)
    async with serving(app, settings) as url, httpx.AsyncClient(timeout=30) as http:
        yield Served(app, url, http)


# FT-01 connection refused and DNS failure


@dataclass
class Dials:
    """Every address the gateway's outbound connections dialled (the event loop's connect, observed)."""

    made: list[tuple[str, int]]

    def to(self, port: int) -> list[str]:
        return [host for host, dialled in self.made if dialled == port]

    def besides(self, url: str) -> list[tuple[str, int]]:
        """The dials to anything but `url` (the test's own client dials the gateway on the same loop)."""
        port = int(url.rsplit(":", 1)[1])
        return [(host, dialled) for host, dialled in self.made if dialled != port]


@pytest.fixture
async def dials(monkeypatch: pytest.MonkeyPatch) -> Dials:
    loop = asyncio.get_running_loop()
    connect = loop.sock_connect
    observed = Dials([])

    async def observe(sock: socket.socket, address: Any) -> None:
        observed.made.append((address[0], address[1]))
        await connect(sock, address)

    monkeypatch.setattr(loop, "sock_connect", observe)
    return observed


async def test_ft01_a_refused_connection_is_a_502_at_once_one_attempt_per_address(
    served: Served, ctx: Context, project: Project, dials: Dials
) -> None:
    port = free_port()
    await add_custom(ctx, project, "down", f"http://localhost:{port}/v1")
    started = time.monotonic()
    response = await served.get("/proxy/down/models", project.token)
    elapsed = time.monotonic() - started
    message = assert_service_error(response, 502)
    assert elapsed < 1
    addresses = {info[4][0] for info in socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)}
    assert sorted(dials.to(port)) == sorted(addresses)  # no retry storm
    assert str(port) not in message
    assert "localhost" not in message


async def test_ft01_a_name_that_never_resolves_is_a_502_without_any_connection(
    served: Served, ctx: Context, project: Project, dials: Dials
) -> None:
    name = "credgate-ft01.invalid"  # RFC 6761: never resolves
    started = time.monotonic()
    with pytest.raises(socket.gaierror):
        await asyncio.get_running_loop().getaddrinfo(name, 443)
    lookup = time.monotonic() - started  # the machine's resolver, which the gateway uses as well
    await add_custom(ctx, project, "nowhere", f"http://{name}/v1")
    started = time.monotonic()
    response = await served.get("/proxy/nowhere/models", project.token)
    elapsed = time.monotonic() - started
    message = assert_service_error(response, 502)
    assert elapsed < lookup + 1
    assert dials.besides(served.url) == []
    assert name not in message


async def test_ft01_a_dns_lookup_that_never_answers_ends_at_the_integration_timeout_with_504(
    served: Served, ctx: Context, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """credgate has no DNS timeout of its own: the wait for the response headers (`timeout_seconds`), which the
    lookup is part of, bounds it (the system resolver gives up earlier when its own timeout is shorter)."""
    loop = asyncio.get_running_loop()
    lookup = loop.getaddrinfo
    asked = asyncio.Event()

    async def silent_server(host: Any, port: Any, **options: Any) -> Any:
        if host == "credgate-ft01-silent.invalid":
            asked.set()
            await asyncio.sleep(3600)
        return await lookup(host, port, **options)

    monkeypatch.setattr(loop, "getaddrinfo", silent_server)
    await add_custom(ctx, project, "silent-dns", "http://credgate-ft01-silent.invalid/v1", timeout_seconds=0.5)
    await get_504_at(served, "/proxy/silent-dns/models", project.token, 0.5)
    assert asked.is_set()


# FT-02 connect timeout


async def test_ft02_a_connect_that_never_completes_is_a_504_at_the_timeout_and_its_socket_is_closed(
    served: Served, ctx: Context, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An address that drops SYNs, stood in for at the event loop's connect (this suite changes no firewall, and
    loopback answers every SYN): the integration's `timeout_seconds` ends the wait, and the socket is released.
    credgate has no connect timeout of its own below that one (the catalogue's 5 s)."""
    loop = asyncio.get_running_loop()
    connect = loop.sock_connect
    blackhole = free_port()
    sockets: list[socket.socket] = []

    async def drop_syns(sock: socket.socket, address: Any) -> None:
        if address[1] == blackhole:
            sockets.append(sock)
            await asyncio.sleep(3600)
        await connect(sock, address)

    monkeypatch.setattr(loop, "sock_connect", drop_syns)
    await add_custom(ctx, project, "blackhole", f"http://127.0.0.1:{blackhole}/v1", timeout_seconds=0.5)
    await get_504_at(served, "/proxy/blackhole/models", project.token, 0.5)
    assert len(sockets) == 1
    assert sockets[0].fileno() == -1  # closed, not left to the garbage collector


# FT-03 hang before response headers


async def test_ft03_hang_before_headers_gets_504_at_the_timeout_and_the_upstream_connection_closes(
    served: Served, ctx: Context, project: Project
) -> None:
    """(test_504_when_the_upstream_does_not_answer_in_time checks the 504 alone.)"""
    async with run_watched_upstream([]) as silent:
        await add_custom(ctx, project, "silent", silent.url, timeout_seconds=0.5)
        started = await get_504_at(served, "/proxy/silent/v1/chat", project.token, 0.5)
        assert await eventually(lambda: silent.hang_ups, within=1.0)
        assert silent.hang_ups[0] - (started + 0.5) < 1.0
        assert served.proxy.in_flight == 0


# FT-04 drip-feed upstream


def drip_head() -> Iterator[bytes | float]:
    """A response head that never ends: one byte of a header value every 100 ms, each read succeeding."""
    yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Drip: "
    for _ in itertools.count():
        yield b"a"
        yield 0.1


async def test_ft04_a_drip_fed_head_cannot_stretch_the_header_timeout(
    served: Served, ctx: Context, project: Project
) -> None:
    """`timeout_seconds` bounds the whole wait for the response head, not each read."""
    async with run_watched_upstream(drip_head()) as dripping:
        await add_custom(ctx, project, "drip", dripping.url, timeout_seconds=0.5)
        await get_504_at(served, "/proxy/drip/v1/chat", project.token, 0.5)
        assert await eventually(lambda: dripping.hang_ups, within=1.0)


def drip_body() -> Iterator[bytes | float]:
    """A stream that never ends: an event every 100 ms, each well within the stream idle timeout."""
    yield SSE_HEAD
    for index in itertools.count():
        yield chunk(b"data: %d\n\n" % index)
        yield 0.1


async def test_ft04_a_body_dripped_after_the_head_is_cut_at_the_total_timeout(
    served: Served, ctx: Context, project: Project
) -> None:
    """The stream idle timeout, which each event resets, cannot end it; the total timeout does, counted from the
    request's arrival, and the upstream connection closes with it."""
    async with run_watched_upstream(drip_body()) as dripping:
        await add_custom(ctx, project, "drip", dripping.url, stream_idle_timeout_seconds=0.5, total_timeout_seconds=1.5)
        chunks, elapsed = await read_until_cut(f"{served.url}/proxy/drip/v1/chat", project.token)
        cut = time.monotonic()
        assert await eventually(lambda: dripping.hang_ups, within=1.0)
    events = b"".join(chunks).split(b"\n\n")[:-1]
    assert events == [b"data: %d" % index for index in range(len(events))]  # whole events, nothing made up
    assert len(events) >= 8
    assert 1.5 <= elapsed < 1.5 + LATE
    assert dripping.hang_ups[0] - cut < 1.0


async def test_ft04_the_total_timeout_bounds_the_wait_for_the_head_too(
    served: Served, ctx: Context, project: Project
) -> None:
    async with run_watched_upstream([]) as thinking:  # answers after an hour
        await add_custom(ctx, project, "thinking", thinking.url, timeout_seconds=60, total_timeout_seconds=0.5)
        await get_504_at(served, "/proxy/thinking/v1/chat", project.token, 0.5)
        assert await eventually(lambda: thinking.hang_ups, within=1.0)


async def read_until_cut(url: str, token: str) -> tuple[list[bytes], float]:
    """Stream a response through the gateway; it must end abnormally. Returns the chunks and the time taken."""
    started = time.monotonic()
    chunks: list[bytes] = []

    async def read_all() -> None:
        async for chunk in response.aiter_raw():
            chunks.append(chunk)

    async with (
        asyncio.timeout(20),  # a response that is never cut fails the test rather than hanging it
        httpx.AsyncClient(timeout=10) as client,
        client.stream("GET", url, headers={"Authorization": f"Bearer {token}"}) as response,
    ):
        assert response.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            await read_all()
    return chunks, time.monotonic() - started


# FT-05 stall mid-stream


async def test_ft05_a_stream_that_stalls_is_cut_at_the_stream_idle_timeout_with_nothing_made_up(
    served: Served, ctx: Context, project: Project
) -> None:
    events = [chunk(b'data: {"n": %d}\n\n' % index) for index in range(5)]
    async with run_watched_upstream([SSE_HEAD, *events]) as stalled:  # then silence, the connection held open
        await add_custom(ctx, project, "stalled", stalled.url, stream_idle_timeout_seconds=0.5)
        chunks, elapsed = await read_until_cut(f"{served.url}/proxy/stalled/v1/chat", project.token)
        cut = time.monotonic()
        assert await eventually(lambda: stalled.hang_ups, within=1.0)
    assert b"".join(chunks) == b"".join(b'data: {"n": %d}\n\n' % index for index in range(5))  # no [DONE], no error
    assert 0.5 <= elapsed < 0.5 + LATE
    assert stalled.hang_ups[0] - cut < 1.0


# FT-06 reset or short body mid-stream


async def test_ft06_broken_chunk_framing_after_good_bytes_cuts_the_response_at_once(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    script: list[bytes | float] = [SSE_HEAD, b"d\r\ndata: first\n\n\r\n", 0.1, b"ZZZ\r\nnot a chunk\r\n", 30.0]
    async with run_raw_upstream(script) as raw:
        await add_custom(ctx, project, "raw", raw.url)
        chunks, elapsed = await read_until_cut(f"{gateway_url}/proxy/raw/x", project.token)
    assert b"".join(chunks) == b"data: first\n\n"  # nothing synthesised after the cut
    assert elapsed < 2


async def test_ft06_a_reset_mid_stream_cuts_the_response(gateway_url: str, ctx: Context, project: Project) -> None:
    script: list[bytes | float] = [SSE_HEAD, b"d\r\ndata: first\n\n\r\n", 0.1]
    async with run_raw_upstream(script, reset=True) as raw:
        await add_custom(ctx, project, "raw", raw.url)
        chunks, elapsed = await read_until_cut(f"{gateway_url}/proxy/raw/x", project.token)
    assert b"".join(chunks) == b"data: first\n\n"
    assert elapsed < 2


async def test_ft06_a_body_shorter_than_its_content_length_is_never_completed(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    async with run_raw_upstream([head, b"x" * 50_000, 0.1]) as raw:
        await add_custom(ctx, project, "raw", raw.url)
        chunks, elapsed = await read_until_cut(f"{gateway_url}/proxy/raw/x", project.token)
    assert len(b"".join(chunks)) == 50_000  # the client's own framing tells it the body is incomplete
    assert elapsed < 2


async def test_ft06_a_cut_response_closes_its_upstream_connection_rather_than_pooling_it(
    served: Served, ctx: Context, project: Project
) -> None:
    script: list[bytes | float] = [SSE_HEAD, chunk(b"data: first\n\n"), 0.1, b"ZZZ\r\nnot a chunk\r\n"]
    async with run_watched_upstream(script) as broken:  # the upstream holds the connection open afterwards
        await add_custom(ctx, project, "broken", broken.url)
        await read_until_cut(f"{served.url}/proxy/broken/x", project.token)
        cut = time.monotonic()
        assert await eventually(lambda: broken.hang_ups, within=1.0)
    assert broken.hang_ups[0] - cut < 1.0


# FT-07 client disconnects mid-stream: in tests/e2e/test_proxy_streams.py,
# test_client_leaving_mid_stream_closes_the_upstream_stream (the upstream stream ends within 1 s of the client
# leaving) and test_a_thousand_departing_clients_leave_nothing_behind (1,000 departures, 50 at a time: no task,
# no pool slot, no upstream stream left); at the catalogue's scale, with fds and RSS, in bench/soak.py.


# FT-08 client disconnects before response headers


async def test_ft08_clients_leaving_before_the_headers_free_every_upstream_connection_and_task(
    served: Served, ctx: Context, project: Project
) -> None:
    """Twenty at once (test_client_leaving_before_the_upstream_answers_closes_the_upstream_connection has one)."""
    async with run_watched_upstream([]) as thinking:  # answers after an hour
        await add_custom(ctx, project, "thinking", thinking.url, timeout_seconds=60)
        baseline = len(asyncio.all_tasks())
        async with httpx.AsyncClient(timeout=30, headers=bearer(project.token)) as client:
            url = f"{served.url}/proxy/thinking/v1/chat/completions"
            requests = [asyncio.create_task(client.post(url, json={"n": index})) for index in range(20)]
            assert await eventually(lambda: len(thinking.asked) == 20, within=5.0)
            await asyncio.sleep(0.3)  # past the gateway's watch delay: the requests are waiting on the upstream
            left = time.monotonic()
            for request in requests:
                request.cancel()
            await asyncio.gather(*requests, return_exceptions=True)
        assert await eventually(lambda: len(thinking.hang_ups) == 20, within=1.5)
        assert max(thinking.hang_ups) - left < 1.0
        assert served.proxy.in_flight == 0
        assert await eventually(lambda: len(asyncio.all_tasks()) <= baseline, within=1.0)


# FT-09 slow reader


async def raw_request(url: str, head: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """Send a request head as written; returns the connection and the response head."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head.encode())
    return reader, writer, await reader.readuntil(b"\r\n\r\n")


async def settled(read: Any, *, quiet: float = 0.5, within: float = 10.0) -> int:
    """`read()` once it has stopped changing for `quiet` seconds."""
    deadline = time.monotonic() + within
    last = read()
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet)
        if read() == last:
            return int(last)
        last = read()
    raise AssertionError(f"still changing after {within} s")


def rss_kib() -> int:
    """This process's resident memory: the gateway's, and the stand-in's and the client's too."""
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


SEND_TIMEOUT = 2.0


@pytest.fixture
async def impatient(settings: Settings, ctx: Context) -> AsyncIterator[Served]:
    """The gateway with `CREDGATE_SEND_TIMEOUT_SECONDS` scaled down."""
    settings = settings.model_copy(update={"send_timeout_seconds": SEND_TIMEOUT})
    app = create_app(settings, context=ctx)
    async with serving(app, settings) as url, httpx.AsyncClient(timeout=30) as http:
        yield Served(app, url, http)


async def test_ft09_a_client_that_stops_reading_holds_little_and_is_closed_at_the_send_timeout(
    impatient: Served, ctx: Context, project: Project
) -> None:
    """Flow control reaches the upstream: it stops writing, and memory does not grow by what it could send. At the
    send timeout the gateway closes the client's connection, and the upstream's with it."""
    async with run_catalogue_upstream() as catalogue:
        await add_custom(ctx, project, "flood", catalogue.url)
        assert (await impatient.get("/proxy/flood/flood?mib=4", project.token)).status_code == 200  # warm
        before, catalogue.flooded = rss_kib(), 0
        head = f"GET /proxy/flood/flood?mib=512 HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {project.token}\r\n\r\n"
        asked = time.monotonic()
        reader, writer, answered = await raw_request(impatient.url, head)
        assert answered.startswith(b"HTTP/1.1 200 ")
        held = await settled(lambda: catalogue.flooded, quiet=0.3)  # the client reads nothing more
        growth = rss_kib() - before
        assert catalogue.active == 1, "the stream ended before the send timeout"
        assert await eventually(lambda: catalogue.active == 0, within=SEND_TIMEOUT + LATE + 1.0)
        released = time.monotonic() - asked
        received = 0
        with contextlib.suppress(ConnectionError):
            while piece := await reader.read(1 << 20):  # what reached this side before the close, then the end
                received += len(piece)
        writer.close()
    assert held < 64 * 1024 * 1024  # socket buffers on both sides, not the 512 MiB offered
    assert growth < 8 * 1024, f"RSS grew by {growth} KiB"
    assert SEND_TIMEOUT <= released < SEND_TIMEOUT + 1.5 + LATE  # the settling took part of the timeout
    assert received < 64 * 1024 * 1024


async def test_ft09_a_slow_but_steady_reader_is_not_cut(impatient: Served, ctx: Context, project: Project) -> None:
    """Only a client that takes nothing for the send timeout is closed: one reading slowly gets its whole body."""
    async with run_catalogue_upstream() as catalogue:
        await add_custom(ctx, project, "flood", catalogue.url)
        head = "GET /proxy/flood/flood?mib=8 HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
        head += f"Authorization: Bearer {project.token}\r\n\r\n"
        reader, writer, answered = await raw_request(impatient.url, head)
        assert answered.startswith(b"HTTP/1.1 200 ")
        started, received = time.monotonic(), 0
        while piece := await reader.read(256 * 1024):
            received += len(piece)
            await asyncio.sleep(0.1)  # about 2.5 MiB/s: the buffers stay full, the writer pauses and resumes
        writer.close()
    assert time.monotonic() - started > SEND_TIMEOUT  # the body took longer than the send timeout
    assert received > 8 * 1024 * 1024  # every byte (and the chunked framing)


# FT-10 upstream errors pass through, and release their connections


@pytest.fixture
async def pooled(settings: Settings, ctx: Context) -> AsyncIterator[tuple[str, Gateway]]:
    """The gateway with an outbound pool of 10 connections, the catalogue's FT-10 setting."""
    gateway = create_app(settings, context=ctx, upstream_connections=10)
    async with serving(gateway, settings) as url:
        yield url, gateway


def relayed_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    """The headers in order, less the framing (chunked or not is each hop's own) and the gateway's id; the
    Date's value differs between two calls of the upstream."""
    own = {b"transfer-encoding", b"x-credgate-request-id", b"connection", b"keep-alive"}
    return [
        (name.lower(), b"" if name.lower() == b"date" else value)
        for name, value in response.headers.raw
        if name.lower() not in own
    ]


async def test_ft10_provider_errors_arrive_byte_identical_and_a_storm_of_them_exhausts_no_pool(
    pooled: tuple[str, Gateway], ctx: Context, project: Project
) -> None:
    url, gateway = pooled
    async with run_catalogue_upstream() as catalogue, httpx.AsyncClient(timeout=10) as client:
        await add_custom(ctx, project, "errors", catalogue.url)
        for status, chunked in itertools.product((400, 401, 403, 404, 429, 500, 503), ("0", "1")):
            body = {"model": "m", "stream": chunked == "1"}
            direct = await client.post(f"{catalogue.url}/status/{status}", params={"chunked": chunked}, json=body)
            relayed = await client.post(
                f"{url}/proxy/errors/status/{status}",
                params={"chunked": chunked},
                json=body,
                headers=bearer(project.token),
            )
            assert (relayed.status_code, relayed.content) == (direct.status_code, direct.content)
            assert relayed_headers(relayed) == relayed_headers(direct)
            assert ENVELOPE_HEADER not in relayed.headers

        async def streamed_429(limit: asyncio.Semaphore) -> int:
            async with (
                limit,
                client.stream(
                    "POST",
                    f"{url}/proxy/errors/status/429?chunked=1",
                    json={"stream": True},
                    headers=bearer(project.token),
                ) as response,
            ):
                await response.aread()
                return response.status_code

        limit = asyncio.Semaphore(10)
        statuses = await asyncio.gather(*(streamed_429(limit) for _ in range(200)))
        assert set(statuses) == {429}
        assert catalogue.peak_active <= 10
        assert gateway.runtime.proxy is not None
        connections = gateway.runtime.proxy.upstreams.connections
        assert await eventually(lambda: connections.in_use == 0, within=1.0)  # no connection left active
        after = await client.post(f"{url}/proxy/errors/slow", headers=bearer(project.token))
        assert after.status_code == 200


# FT-11 compressed responses


async def test_ft11_compressed_responses_arrive_as_sent_with_a_matching_encoding_and_length(
    served: Served, ctx: Context, project: Project
) -> None:
    """Pass-through: the upstream's gzip bytes and its Content-Encoding, whatever the client accepts (the
    upstream chose the encoding); never decoded bytes under a stale Content-Encoding or Content-Length."""
    async with run_catalogue_upstream() as catalogue:
        await add_custom(ctx, project, "zipped", catalogue.url)
        for path, accept in itertools.product(("gzip/200", "gzip/500", "gzip/200?sse=1"), ("gzip", "identity")):
            direct, sent = await raw_response(served.http, f"{catalogue.url}/{path}", {"Accept-Encoding": accept})
            relayed, raw = await raw_response(
                served.http, f"{served.url}/proxy/zipped/{path}", {"Accept-Encoding": accept, **bearer(project.token)}
            )
            assert relayed.status_code == direct.status_code, path
            assert relayed.headers["content-encoding"] == "gzip", path
            assert raw == sent, path
            assert relayed.headers.get("content-length", str(len(raw))) == str(len(raw)), path
            assert gzip.decompress(raw) == (b"".join(GZIP_EVENTS) if "sse" in path else gzip.decompress(sent)), path


async def raw_response(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> tuple[httpx.Response, bytes]:
    async with client.stream("GET", url, headers=headers) as response:
        return response, b"".join([piece async for piece in response.aiter_raw()])


# FT-12 database unavailable


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """SQLite, but PostgreSQL where a test asks (FT-12: the database behind a relay that can refuse or hang)."""
    name = str(getattr(request, "param", "sqlite"))
    if name == "postgresql" and not POSTGRES_URL:
        if REQUIRE_POSTGRES:
            pytest.fail("CREDGATE_TEST_REQUIRE_POSTGRES=1 but CREDGATE_TEST_POSTGRES_URL is not set")
        pytest.skip("PostgreSQL tests need CREDGATE_TEST_POSTGRES_URL (the README's test command sets it)")
    return name


@dataclass
class Relayed:
    """A gateway whose database connections pass through a fault relay, with two projects and an admin token:
    `warm`'s token is cached before the fault, `cold`'s is not."""

    relay: FaultRelay
    http: httpx.AsyncClient
    upstream: Upstream
    warm: Project
    cold: Project
    admin_token: str

    async def chat(self, project: Project) -> httpx.Response:
        return await self.http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(project.token))


# The database's bounds, shortened so that a hang is over within a test's patience (production: 5 s and 15 s).
SHORT_BOUNDS = {"timeout": 1.5, "command_timeout": 2.0}


@pytest.fixture
async def relayed(
    settings: Settings, database: tuple[str, dict[str, Any]], upstream: Upstream, stale_seconds: float
) -> AsyncIterator[Relayed]:
    url = make_url(database[0])
    async with run_fault_relay(url.host or "127.0.0.1", url.port or 5432) as relay:
        through = url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
        settings = settings.model_copy(update={"database_url": through, "stale_seconds": stale_seconds})
        ctx = await open_context(settings, connect_args={**database[1], **SHORT_BOUNDS})
        try:
            warm, cold = await add_project(ctx, upstream), await add_project(ctx, upstream)
            admin_token = await admins.create_admin_token(ctx, name="ft12", actor="t")
            async with (
                serving(create_app(settings, context=ctx), settings) as gateway_url,
                httpx.AsyncClient(base_url=gateway_url, timeout=10) as http,
            ):
                relayed = Relayed(relay, http, upstream, warm, cold, admin_token)
                await asyncio.sleep(settings.change_poll_seconds * 2)  # after the change follower's first read
                assert (await relayed.chat(warm)).status_code == 200
                yield relayed
                relay.restore()  # so the gateway's lifespan and the context can close their connections
        finally:
            relay.restore()
            await ctx.database.dispose()


POSTGRES_BEHIND_A_RELAY = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)


@POSTGRES_BEHIND_A_RELAY
async def test_ft12_while_the_database_refuses_unknown_tokens_and_writes_get_503_and_service_resumes(
    relayed: Relayed,
) -> None:
    """A cached token goes on being served (for CREDGATE_STALE_SECONDS, 30 here)."""
    relayed.relay.refuse()
    stale = await relayed.chat(relayed.warm)
    started = time.monotonic()
    unknown = await relayed.chat(relayed.cold)
    elapsed = time.monotonic() - started
    write = await relayed.http.post("/api/v1/projects", json={"name": "lost"}, headers=bearer(relayed.admin_token))
    ready = await relayed.http.get("/readyz")
    assert stale.status_code == 200
    assert_service_error(unknown, 503)  # never 401, never forwarded
    assert elapsed < 1
    assert_service_error(write, 503)
    assert ready.status_code == 503
    assert len(relayed.upstream.received) == 2  # the warm-up and the stale request

    relayed.relay.restore()
    back = await eventually(lambda: serves(relayed, relayed.cold), within=5, every=0.1)
    assert back, "not serving again within 5 s of the database's return"
    listed = await relayed.http.get("/api/v1/projects", headers=bearer(relayed.admin_token))
    assert sorted(item["id"] for item in listed.json()["items"]) == sorted([relayed.warm.id, relayed.cold.id])


@POSTGRES_BEHIND_A_RELAY
@pytest.mark.parametrize("stale_seconds", [1.0])
async def test_ft12_what_was_cached_is_served_for_the_stale_seconds_then_503_until_the_database_is_back(
    relayed: Relayed,
) -> None:
    relayed.relay.refuse()
    down = time.monotonic()
    assert (await relayed.chat(relayed.warm)).status_code == 200
    deadline = down + 1 + 0.5 * 2 + 2  # the bound, a poll interval either side, and a loaded machine's slack
    while (stale := await relayed.chat(relayed.warm)).status_code == 200:
        assert time.monotonic() < deadline, "still served from memory long after CREDGATE_STALE_SECONDS"
        await asyncio.sleep(0.05)
    assert_service_error(stale, 503)
    assert len(relayed.upstream.received) >= 2
    assert database_up() == 0  # what /metrics shows an operator, as credgate_dependency_up{dependency="database"}

    relayed.relay.restore()
    back = await eventually(lambda: database_up() == 1 and serves(relayed, relayed.warm), within=5, every=0.1)
    assert back, "not serving again within 5 s of the database's return"


def database_up() -> float | None:
    return REGISTRY.get_sample_value("credgate_dependency_up", {"dependency": "database"})


async def serves(relayed: Relayed, project: Project) -> bool:
    return (await relayed.chat(project)).status_code == 200


@POSTGRES_BEHIND_A_RELAY
@pytest.mark.parametrize("stale_seconds", [0.0])
async def test_ft12_with_no_stale_seconds_nothing_is_served_once_the_database_is_found_not_answering(
    relayed: Relayed,
) -> None:
    relayed.relay.refuse()
    before = len(relayed.upstream.received)
    await asyncio.sleep(0.5 * 2 + 0.5)  # a poll has found it
    assert_service_error(await relayed.chat(relayed.warm), 503)
    assert len(relayed.upstream.received) == before


@POSTGRES_BEHIND_A_RELAY
async def test_ft12_while_the_database_hangs_admin_reads_and_writes_get_503_in_bounded_time_and_nothing_is_half_done(
    relayed: Relayed,
) -> None:
    relayed.relay.hang()
    admin = bearer(relayed.admin_token)
    (write, write_took), (read, read_took) = await asyncio.gather(
        within(20, relayed.http.post("/api/v1/projects", json={"name": "in-the-hang"}, headers=admin), "a write"),
        within(20, relayed.http.get("/api/v1/projects", headers=admin), "a read"),
    )
    assert_service_error(write, 503)
    assert_service_error(read, 503)
    # Bounded by the command timeout (2 s here) then a new connection's (1.5 s), plus a loaded machine's slack.
    assert write_took < 8
    assert read_took < 8
    relayed.relay.restore()
    deadline = time.monotonic() + 10
    while (listed := await relayed.http.get("/api/v1/projects", headers=admin)).status_code != 200:
        assert time.monotonic() < deadline, "admin API not answering within 10 s of the database's return"
        await asyncio.sleep(0.1)
    assert "in-the-hang" not in [item["name"] for item in listed.json()["items"]]  # a 503 changed nothing


async def within(seconds: float, call: Any, what: str) -> tuple[httpx.Response, float]:
    """The response to `call` and the time it took, failing the test if none comes within `seconds`."""
    started = time.monotonic()
    try:
        response = await asyncio.wait_for(call, seconds)
    except TimeoutError:
        pytest.fail(f"{what}: no answer within {seconds} s while the database hangs")
    return response, time.monotonic() - started


@POSTGRES_BEHIND_A_RELAY
async def test_ft12_while_the_database_hangs_unknown_tokens_and_readiness_get_503_in_bounded_time(
    relayed: Relayed,
) -> None:
    """The lookup's bound is 5 s (the catalogue's 2 s proved too short for a busy but healthy SQLite), /readyz's
    2 s; two seconds more are allowed here for a loaded machine. (Admin writes while the
    database hangs wait on its connection: bounding them belongs with the database-fault work still to come.)"""
    relayed.relay.hang()
    stale = await relayed.chat(relayed.warm)
    (unknown, unknown_took), (ready, ready_took) = await asyncio.gather(
        within(9, relayed.chat(relayed.cold), "a proxy request with an unknown token"),
        within(9, relayed.http.get("/readyz"), "/readyz"),
    )
    assert stale.status_code == 200
    assert_service_error(unknown, 503)
    assert ready.status_code == 503
    assert unknown_took < LOOKUP_TIMEOUT_SECONDS + 2
    assert ready_took < 4
    relayed.relay.restore()
    back = await eventually(lambda: serves(relayed, relayed.cold), within=5, every=0.1)
    assert back, "not serving again within 5 s of the database's return"


# FT-13 key rotation with requests in flight


async def test_ft13_streams_in_flight_finish_on_their_key_and_requests_after_the_rotation_carry_the_new_one(
    served: Served, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_custom(ctx, project, "stand-in", upstream.url)
    new_key = "sk-ft13-" + secrets.token_urlsafe(16)
    SWEEP.register(new_key)
    async with httpx.AsyncClient(headers=bearer(project.token), timeout=10) as client:
        stream_url = f"{served.url}/proxy/stand-in/sse?n=10&delay=0.05"
        streams = [asyncio.create_task(client.get(stream_url)) for _ in range(10)]
        assert await eventually(lambda: upstream.open_streams == 10, within=5.0)
        await integrations.set_provider_key(ctx, project_id=project.id, provider="stand-in", api_key=new_key, actor="t")
        after = await client.get(f"{served.url}/proxy/stand-in/echo/after")
        finished = await asyncio.gather(*streams)
    assert [(response.status_code, response.content.count(b"data: ")) for response in finished] == [(200, 10)] * 10
    old = {received.header("authorization") for received in upstream.received[:10]}
    assert len(old) == 1
    assert old != {f"Bearer {new_key}"}
    assert after.status_code == 200
    assert upstream.last.header("authorization") == f"Bearer {new_key}"


# FT-14 revocation of the provider key or the project token


@pytest.mark.parametrize(("revoked", "status"), [("provider key", 403), ("project token", 401)])
async def test_ft14_after_a_revocation_new_requests_fail_at_once_and_open_streams_finish(
    served: Served, ctx: Context, project: Project, upstream: Upstream, revoked: str, status: int
) -> None:
    """The catalogue's choice for a revoked key is 409; the contract's is 403 (the integration's key is revoked).
    Streams already open are allowed to finish, the catalogue's default policy."""
    await add_custom(ctx, project, "stand-in", upstream.url)
    async with httpx.AsyncClient(headers=bearer(project.token), timeout=10) as client:
        stream_url = f"{served.url}/proxy/stand-in/sse?n=10&delay=0.05"
        streams = [asyncio.create_task(client.get(stream_url)) for _ in range(3)]
        assert await eventually(lambda: upstream.open_streams == 3, within=5.0)
        if revoked == "provider key":
            await integrations.revoke_provider_key(ctx, project_id=project.id, provider="stand-in", actor="t")
        else:
            await projects.revoke_project_tokens(ctx, project_id=project.id, actor="t")
        refused = await client.get(f"{served.url}/proxy/stand-in/echo/after")
        finished = await asyncio.gather(*streams)
    assert_service_error(refused, status)
    assert len(upstream.received) == 3
    assert [(response.status_code, response.content.count(b"data: ")) for response in finished] == [(200, 10)] * 3


# FT-15 graceful restart


async def add_served_project(data_dir: Path, provider: str, base_url: str) -> str:
    """A project of the `credgate serve` on `data_dir`, with a custom integration allowing everything; its token."""
    ctx = await open_context(Settings(data_dir=data_dir, allow_private_upstreams=True))
    try:
        created, token = await projects.create_project(ctx, name=provider, actor="t")
        await add_custom(ctx, Project(created.id, token, ""), provider, base_url)
    finally:
        await ctx.database.dispose()
    return token


async def test_ft15_on_sigterm_the_listener_closes_streams_finish_within_the_drain_then_are_cut_and_the_exit_is_0(
    tmp_path: Path, upstream: Upstream
) -> None:
    drain = 2.0
    popen, running = start_gateway(tmp_path / "data", tmp_path / "gateway.log", {"CREDGATE_DRAIN_SECONDS": str(drain)})
    try:
        token = await add_served_project(tmp_path / "data", "stand-in", upstream.url)
        async with httpx.AsyncClient(base_url=running.url, headers=bearer(token), timeout=10) as client:
            sse = "/proxy/stand-in/sse?delay=0.05&n="
            async with client.stream("GET", f"{sse}10") as short, client.stream("GET", f"{sse}100000") as endless:
                short_lines, endless_lines = short.aiter_lines(), endless.aiter_lines()
                events = [await anext(short_lines), await anext(endless_lines)]
                popen.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                await asyncio.sleep(0.3)
                with pytest.raises(httpx.ConnectError):  # not ready: nothing new is accepted
                    await httpx.AsyncClient().get(f"{running.url}/readyz")
                events += [line async for line in short_lines]  # finishes within the drain
                with pytest.raises(httpx.RemoteProtocolError):  # cut at its end, never completed
                    async for _ in endless_lines:
                        pass
                cut = time.monotonic() - signalled
        exit_code = await asyncio.to_thread(popen.wait, 10)
        exited = time.monotonic() - signalled
    finally:
        stop_gateway(popen, running)
    assert sum(line.startswith("data: ") for line in events) == 11  # the short stream's 10, the endless one's first
    assert drain <= cut < drain + 1
    assert exit_code == 0
    assert exited < drain + 1


# FT-16 crash durability


@dataclass
class Written:
    """One writer's project as the admin API acknowledged it, and every key it tried to set."""

    token: str
    acknowledged: list[str]  # keys, in the order their writes were answered 2xx
    attempted: list[str]
    endpoints: bool = False  # the allow-list write was answered 2xx
    endpoints_sent: bool = False  # it was sent: the kill may have come after its commit, before its answer


async def write_until_killed(http: httpx.AsyncClient, upstream: Upstream, written: dict[str, Written], n: int) -> None:
    """Admin writes in a loop (project, integration, endpoints, key rotations), noting each answered 2xx."""
    with contextlib.suppress(httpx.TransportError):
        for round_ in itertools.count():
            created = await http.post("/projects", json={"name": f"w{n}-{round_}"})
            assert created.status_code == 201
            noted = written[created.json()["project"]["id"]] = Written(created.json()["secret"], [], [])
            path = f"/projects/{created.json()['project']['id']}/integrations"
            for rotation in range(4):
                key = f"sk-ft16-{n}-{round_}-{rotation}-" + secrets.token_urlsafe(12)
                SWEEP.register(key)
                noted.attempted.append(key)
                if rotation == 0:
                    body = {"provider": "stand-in", "base_url": f"{upstream.url}/echo", "api_key": key}
                    assert (await http.post(path, json=body)).status_code == 201
                else:
                    assert (await http.put(f"{path}/stand-in/key", json={"api_key": key})).status_code == 200
                noted.acknowledged.append(key)
                if rotation == 0:
                    everything = {"endpoints": [{"method": "*", "path": "**"}]}
                    noted.endpoints_sent = True
                    assert (await http.put(f"{path}/stand-in/endpoints", json=everything)).status_code == 200
                    noted.endpoints = True


async def test_ft16_after_kill_9_every_acknowledged_admin_write_is_there_whole_and_serves(
    tmp_path: Path, upstream: Upstream
) -> None:
    popen, running = start_gateway(tmp_path / "data", tmp_path / "killed.log")
    written: dict[str, Written] = {}
    try:
        ctx = await open_context(Settings(data_dir=tmp_path / "data"))
        admin = bearer(await admins.create_admin_token(ctx, name="ft16", actor="t"))
        await ctx.database.dispose()
        async with httpx.AsyncClient(base_url=f"{running.url}/api/v1", headers=admin, timeout=10) as http:
            writers = [asyncio.create_task(write_until_killed(http, upstream, written, n)) for n in range(4)]
            # Killed mid-write once four keys are acknowledged (within 30 s: a loaded machine may take its time).
            acknowledged = await eventually(
                lambda: sum(len(noted.acknowledged) for noted in written.values()) >= 4, within=30
            )
            await asyncio.sleep(0.2)
            popen.kill()
            await asyncio.gather(*writers)
    finally:
        stop_gateway(popen, running)
    assert acknowledged, "four keys were not acknowledged within 30 s"
    # The restart, in this process: the same start-up checks and migrations as `credgate serve`, then serving.
    settings = Settings(data_dir=tmp_path / "data", allow_private_upstreams=True)
    ctx = await open_context(settings)
    try:
        async with (
            serving(create_app(settings, context=ctx), settings) as url,
            httpx.AsyncClient(base_url=url, headers=admin, timeout=10) as http,
        ):
            await verify_acknowledged_writes(http, upstream, written)
    finally:
        await ctx.database.dispose()


async def verify_acknowledged_writes(http: httpx.AsyncClient, upstream: Upstream, written: dict[str, Written]) -> None:
    """Every project answered 201 is there; every integration is whole; every acknowledged key serves."""
    stored = {item["id"] for item in (await http.get("/api/v1/projects")).json()["items"]}
    assert set(written) <= stored  # every project answered 201 is there
    for project_id in stored:  # and every integration is whole: created with its key, or not at all
        listed = (await http.get(f"/api/v1/projects/{project_id}/integrations")).json()["items"]
        assert all(item["key"]["status"] == "active" for item in listed)
    for noted in written.values():
        if not noted.acknowledged:
            continue
        response = await http.get("/proxy/stand-in/ping", headers=bearer(noted.token))
        # Never a key that does not open: 200 once the allow-list was acknowledged, 403 if it was never sent, and
        # either when the kill came between its commit and its answer.
        expected = {200} if noted.endpoints else {200, 403} if noted.endpoints_sent else {403}
        assert response.status_code in expected
        if response.status_code == 200:
            used = upstream.last.header("authorization")
            later = noted.attempted[noted.attempted.index(noted.acknowledged[-1]) :]
            assert used in {f"Bearer {key}" for key in later}  # the last acknowledged key, or a later one


# FT-17 hostile upstream responses


async def test_ft17_an_invalid_status_line_before_any_byte_reached_the_client_is_a_502(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    async with run_raw_upstream([b"HTTP/1.1 abc Whatever\r\n\r\n"]) as raw:
        await add_custom(ctx, project, "raw", raw.url)
        async with httpx.AsyncClient() as client:
            response = await client.get(
                f"{gateway_url}/proxy/raw/x", headers={"Authorization": f"Bearer {project.token}"}
            )
            again = await client.get(f"{gateway_url}/healthz")  # same keep-alive connection: not desynchronised
    assert response.status_code == 502
    assert response.headers["x-credgate-error"] == "true"
    assert again.status_code == 200


HOSTILE_HEADS = {
    "128 KiB of headers": b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 131072 + b"\r\nContent-Length: 0\r\n\r\n",
    "10,000 headers": b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"X-H%d: v\r\n" % index for index in range(10_000))
    + b"Content-Length: 0\r\n\r\n",
    "HTTP/0.9 garbage": b"<html>no status line, no headers</html>\n",
    "Content-Length with chunked": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
    + chunk(b"hello")
    + b"0\r\n\r\n",
}


async def test_ft17_a_protocol_violation_before_any_byte_is_a_502_and_the_client_connection_stays_in_sync(
    served: Served, ctx: Context, project: Project
) -> None:
    for number, (hostile, head) in enumerate(HOSTILE_HEADS.items()):
        async with run_raw_upstream([head]) as raw:
            await add_custom(ctx, project, f"hostile{number}", raw.url)
            response = await served.get(f"/proxy/hostile{number}/x", project.token)
            again = await served.http.get(f"{served.url}/healthz")  # the same keep-alive connection
        assert (response.status_code, response.headers.get(ENVELOPE_HEADER)) == (502, "true"), hostile
        assert again.status_code == 200, hostile
    assert served.proxy.in_flight == 0


async def test_ft17_a_huge_response_body_streams_through_without_growing_the_gateway(
    served: Served, ctx: Context, project: Project
) -> None:
    """The catalogue's 2 GiB, scaled to 64 MiB (eight times the bound): relayed as it comes, never buffered."""
    async with run_catalogue_upstream() as catalogue:
        await add_custom(ctx, project, "huge", catalogue.url)
        assert (await served.get("/proxy/huge/flood?mib=4", project.token)).status_code == 200  # warm
        before = peak = rss_kib()
        received = 0
        url = f"{served.url}/proxy/huge/flood?mib=64"
        async with served.http.stream("GET", url, headers=bearer(project.token)) as response:
            async for piece in response.aiter_raw():
                received += len(piece)
                if received % (4 * 1024 * 1024) < len(piece):
                    peak = max(peak, rss_kib())
    assert received == 64 * 1024 * 1024
    assert peak - before < 8 * 1024, f"RSS grew by {peak - before} KiB"


async def test_ft17_an_endless_stream_read_as_fast_as_it_comes_is_cut_at_the_total_timeout(
    served: Served, ctx: Context, project: Project
) -> None:
    """A response that always has bytes ready, so that the relay never waits for more, is still cut."""
    async with run_catalogue_upstream() as catalogue:
        await add_custom(ctx, project, "endless", catalogue.url, total_timeout_seconds=1.0)
        chunks, elapsed = await read_until_cut(f"{served.url}/proxy/endless/flood?mib=1000000", project.token)
        assert await eventually(lambda: catalogue.active == 0, within=1.0)
    assert sum(len(piece) for piece in chunks) > 1024 * 1024
    assert 1.0 <= elapsed < 1.0 + LATE


# FT-18 OAuth token endpoint faults


@pytest.fixture
async def token_endpoint() -> AsyncIterator[TokenEndpoint]:
    async with run_token_endpoint() as endpoint:
        yield endpoint


async def add_oauth(
    ctx: Context, project: Project, upstream: Upstream, token_url: str, provider: str = "secured"
) -> str:
    """A custom integration whose key is an OAuth 2.0 client secret; returns the secret."""
    secret = "oauth-ft18-" + secrets.token_urlsafe(16)
    SWEEP.register(secret)
    auth = OAuth2ClientCredentialsAuth(method="oauth2_client_credentials", token_url=token_url, client_id="cg")
    await integrations.add_custom_integration(
        ctx,
        project_id=project.id,
        provider=provider,
        base_url=f"{upstream.url}/echo",
        api_key=secret,
        auth=auth,
        actor="t",
    )
    everything = [Endpoint(method="*", path="**")]
    await integrations.set_endpoints(ctx, project_id=project.id, provider=provider, endpoints=everything, actor="t")
    return secret


async def test_ft18_a_failing_token_endpoint_is_a_502_without_the_secret_and_is_not_hammered(
    served: Served,
    ctx: Context,
    project: Project,
    upstream: Upstream,
    dials: Dials,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A burst finds the endpoint refusing connections, hanging, answering 500 or answering garbage: one call,
    its failure shared and kept for a pause. (A 401 refusal is
    test_a_refused_fetch_is_a_clear_502_without_the_secret_and_is_not_retried_at_once.) The token endpoint's
    timeout (30 s, not a setting) is scaled down here by hand."""
    monkeypatch.setattr(oauth, "_FETCH_TIMEOUT_SECONDS", 0.5)
    for fault in ("refused", "hangs", "status 500", "malformed JSON"):
        async with run_token_endpoint() as endpoint:
            endpoint.hang = fault == "hangs"
            endpoint.status = 500 if fault == "status 500" else 200
            endpoint.malformed = fault == "malformed JSON"
            closed = free_port()
            token_url = f"http://127.0.0.1:{closed}/oauth/token" if fault == "refused" else endpoint.url
            provider = "secured-" + fault.split()[0].lower()
            secret = await add_oauth(ctx, project, upstream, token_url, provider)
            started = time.monotonic()
            burst = await asyncio.gather(*(served.get(f"/proxy/{provider}/v1/data", project.token) for _ in range(20)))
            elapsed = time.monotonic() - started
            messages = {assert_service_error(response, 502) for response in burst}
            assert len(messages) == 1, fault
            assert secret not in messages.pop(), fault
            assert elapsed < 1.5, fault
            assert (len(dials.to(closed)) if fault == "refused" else endpoint.calls) == 1, fault
            assert oauth_fetches(provider, "failed") == 1, fault  # one fetch, counted once, shared by 20
            assert oauth_fetches(provider, "ok") is None, fault
    assert upstream.received == []


def oauth_fetches(provider: str, result: str) -> float | None:
    return REGISTRY.get_sample_value("credgate_oauth_token_fetches_total", {"provider": provider, "result": result})


async def test_ft18_a_hundred_requests_finding_the_token_due_share_one_renewal(
    served: Served, ctx: Context, project: Project, upstream: Upstream, token_endpoint: TokenEndpoint
) -> None:
    """A renewal under load (the first fetch, shared by a burst, is
    test_many_requests_at_once_share_one_fetch_and_later_ones_the_cached_token)."""
    token_endpoint.lifetime = 4  # renewed in its last two seconds
    await add_oauth(ctx, project, upstream, token_endpoint.url)
    before = oauth_fetches("secured", "ok") or 0
    assert (await served.get("/proxy/secured/v1/data", project.token)).status_code == 200
    assert oauth_fetches("secured", "ok") == before + 1
    await asyncio.sleep(2.05)
    burst = await asyncio.gather(*(served.get("/proxy/secured/v1/data", project.token) for _ in range(100)))
    assert {response.status_code for response in burst} == {200}
    assert token_endpoint.calls == 2
    assert {received.header("authorization") for received in upstream.received[1:]} == {"Bearer access-2"}


async def test_ft18_a_token_said_to_expire_at_once_is_not_kept(
    served: Served, ctx: Context, project: Project, upstream: Upstream, token_endpoint: TokenEndpoint
) -> None:
    """`expires_in: 0` (RFC 6749 section 5.1: the token's lifetime in seconds) is not an absent lifetime."""
    token_endpoint.lifetime = 0
    await add_oauth(ctx, project, upstream, token_endpoint.url)
    for _ in range(2):
        assert (await served.get("/proxy/secured/v1/data", project.token)).status_code == 200
        await asyncio.sleep(0.1)
    assert token_endpoint.calls == 2
    assert upstream.last.header("authorization") == "Bearer access-2"
