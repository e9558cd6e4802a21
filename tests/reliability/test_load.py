"""Catalogue group LS: load and soak, scaled down to seconds on loopback, with relative criteria.

The catalogue's long runs live in the bench: LS-05 (the soak) and LS-06 (disconnect and error storms, with FT-07's
1,000 disconnects) are `bench/soak.py`, LS-01's throughput and latency at scale `bench/run.py`; their figures are
in bench/RESULTS.md. What runs here checks the same properties in seconds.
"""

import asyncio
import contextlib
import hashlib
import io
import re
import secrets
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from prometheus_client import REGISTRY

from credgate.app import Gateway, create_app
from credgate.config import Settings
from credgate.fleet.concurrency import LocalPlaces
from credgate.proxy import ProxyApp, relay
from credgate.services import integrations, projects
from credgate.services.bootstrap import open_context
from credgate.services.context import Context
from credgate.services.projects import ProjectChanges
from tests.e2e.conftest import Project, add_custom, add_project, bearer, serving, start_gateway, stop_gateway
from tests.polling import eventually
from tests.secret_sweep import SWEEP
from tests.upstream import CatalogueUpstream, Upstream, run_catalogue_upstream, run_watched_upstream

HEADER_TIMEOUT = 0.5


@pytest.fixture
def settings(database: tuple[str, dict[str, object]], tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database[0],
        allow_private_upstreams=True,
        header_timeout_seconds=HEADER_TIMEOUT,
    )


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


@dataclass
class Served:
    app: Gateway
    url: str
    http: aiohttp.ClientSession  # the load client: httpx's pool is slow with many requests waiting

    @property
    def proxy(self) -> ProxyApp:
        assert isinstance(self.app.proxy, ProxyApp)
        return self.app.proxy


@pytest.fixture
async def served(settings: Settings, ctx: Context) -> AsyncIterator[Served]:
    app = create_app(settings, context=ctx)
    async with (
        serving(app, settings) as url,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=500), auto_decompress=False) as http,
    ):
        yield Served(app, url, http)


@pytest.fixture
async def catalogue() -> AsyncIterator[CatalogueUpstream]:
    async with run_catalogue_upstream() as running:
        yield running


async def timed_get(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> tuple[int, float, Any]:
    """Status, seconds taken, and the body (JSON for a service error, else its length)."""
    started = time.monotonic()
    async with http.get(url, headers=headers) as response:
        body = await response.read()
        parsed = await response.json() if response.headers.get("x-credgate-error") == "true" else len(body)
        retry_after = response.headers.get("retry-after")
        return response.status, time.monotonic() - started, (parsed, retry_after)


# LS-01 overhead


async def test_ls01_the_gateway_adds_little_latency_to_a_call_and_no_error(
    served: Served, ctx: Context, project: Project, catalogue: CatalogueUpstream
) -> None:
    """Direct and proxied calls interleaved (so both see the same load on the machine), 1 KiB each way."""
    await add_custom(ctx, project, "fast", catalogue.url)
    payload = b"x" * 1024
    direct: list[float] = []
    proxied: list[float] = []
    for _ in range(150):
        for url, times, headers in (
            (f"{catalogue.url}/sha256", direct, {}),
            (f"{served.url}/proxy/fast/sha256", proxied, bearer(project.token)),
        ):
            started = time.monotonic()
            async with served.http.post(url, data=payload, headers=headers) as response:
                assert response.status == 200
                await response.read()
            times.append(time.monotonic() - started)
    added_p50 = statistics.median(proxied) - statistics.median(direct)
    added_p95 = percentile(proxied, 0.95) - percentile(direct, 0.95)
    assert added_p50 < 0.005, f"added p50 {added_p50 * 1000:.2f} ms"
    assert added_p95 < 0.015, f"added p95 {added_p95 * 1000:.2f} ms"


# LS-02 streaming fidelity and latency under load

SENT_AT = re.compile(rb"data: at=(\d+\.\d{6}) ")


async def read_stream(
    http: aiohttp.ClientSession, url: str, token: str, after: float = 0.0
) -> tuple[str, list[float], float]:
    """The stream's SHA-256, each event's delay from the upstream's write to its arrival here, and when the
    first event arrived relative to the stream's end. `after` seconds pass before the request."""
    await asyncio.sleep(after)
    digest, delays, seen = hashlib.sha256(), [], b""
    first = end = 0.0
    async with http.get(url, headers=bearer(token)) as response:
        assert response.status == 200
        async for piece in response.content.iter_any():
            now = time.monotonic()
            first = first or now
            digest.update(piece)
            seen += piece
            matches = list(SENT_AT.finditer(seen))
            delays += [now - float(match.group(1)) for match in matches]
            if matches:
                seen = seen[matches[-1].end() :]
        end = time.monotonic()
    return digest.hexdigest(), delays, end - first


async def test_ls02_concurrent_streams_arrive_byte_identical_and_event_by_event(
    served: Served, ctx: Context, project: Project, catalogue: CatalogueUpstream
) -> None:
    """40 streams of 20 events (10 B to 8 KiB, `\\n` and `\\r\\n` endings, comment lines) 50 ms apart, through the
    gateway, among 20 streams read straight from the upstream. The forwarding delay is what the gateway's
    streams lose against those: one event loop runs the gateway, the upstream and every client here, so when
    the machine is busy they all wait for it alike, and an event's delay from write to read measures the
    machine as much as the gateway. The streams start spread over one 50 ms interval, as real ones do."""
    await add_custom(ctx, project, "events", catalogue.url)
    through, straight = f"{served.url}/proxy/events/sse-varied", f"{catalogue.url}/sse-varied"
    urls = [f"{through if n % 3 else straight}?n=20&delay=0.05&id={n}" for n in range(60)]
    results = await asyncio.gather(
        *(read_stream(served.http, url, project.token, after=n * 0.05 / 60) for n, url in enumerate(urls))
    )
    assert [digest for digest, _, _ in results] == [catalogue.sent[str(n)] for n in range(60)]
    proxied = [delay for n, (_, delays, _) in enumerate(results) if n % 3 for delay in delays]
    direct = [delay for n, (_, delays, _) in enumerate(results) if not n % 3 for delay in delays]
    assert len(proxied) == 40 * 20
    added = {q: percentile(proxied, q) - percentile(direct, q) for q in (0.5, 0.99)}
    shown = "; ".join(
        f"{name} p50 {percentile(delays, 0.5) * 1000:.1f} ms, p99 {percentile(delays, 0.99) * 1000:.1f} ms"
        for name, delays in (("through the gateway", proxied), ("straight", direct))
    )
    assert added[0.5] < 0.01, f"the gateway adds {added[0.5] * 1000:.1f} ms to the median event ({shown})"
    assert added[0.99] < 0.05, f"the gateway adds {added[0.99] * 1000:.1f} ms to the p99 event ({shown})"
    assert all(spread > 0.8 for _, _, spread in results)  # the first event came a second before the last


# LS-03 overload shedding and recovery


async def test_ls03_requests_over_the_in_flight_cap_get_a_quick_503_and_service_recovers(
    served: Served, ctx: Context, project: Project, catalogue: CatalogueUpstream
) -> None:
    """The cap (ProxyApp.max_in_flight, 1,000 in production) scaled to 4. The catalogue also asks for
    Retry-After on these 503s: not sent yet."""
    await add_custom(ctx, project, "busy", catalogue.url)
    served.proxy.max_in_flight = 4
    catalogue.delay = 0.5
    url = f"{served.url}/proxy/busy/slow"
    burst = await asyncio.gather(*(timed_get(served.http, url, bearer(project.token)) for _ in range(20)))
    admitted = [seconds for status, seconds, _ in burst if status == 200]
    shed = [(seconds, body) for status, seconds, (body, _) in burst if status == 503]
    assert len(admitted) == 4
    assert len(shed) == 16
    assert all(body["error"]["status"] == 503 and "overloaded" in body["error"]["message"] for _, body in shed)
    assert max(seconds for seconds, _ in shed) < 0.25  # shed at once, not queued
    catalogue.delay = 0.0
    after = await asyncio.gather(*(timed_get(served.http, url, bearer(project.token)) for _ in range(4)))
    assert [status for status, _, _ in after] == [200] * 4
    assert served.proxy.in_flight == 0


async def test_the_in_flight_gauge_shows_the_requests_under_way_set_once_a_turn_not_raised_and_lowered_each(
    served: Served, ctx: Context, project: Project, catalogue: CatalogueUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    await add_custom(ctx, project, "busy", catalogue.url)
    catalogue.delay = 1.5  # each request held long enough to be seen under way, on a busy machine too
    moved: list[str] = []
    monkeypatch.setattr(relay._IN_FLIGHT, "inc", lambda amount=1: moved.append("inc"))
    monkeypatch.setattr(relay._IN_FLIGHT, "dec", lambda amount=1: moved.append("dec"))

    def shown() -> float | None:
        return REGISTRY.get_sample_value("credgate_in_flight_requests")

    url = f"{served.url}/proxy/busy/slow"
    burst = asyncio.gather(*(timed_get(served.http, url, bearer(project.token)) for _ in range(6)))
    assert await eventually(lambda: shown() == 6, within=1.2)
    assert [status for status, _, _ in await burst] == [200] * 6
    assert await eventually(lambda: shown() == 0, within=1.0)
    assert moved == []


# LS-04 slowloris and connection floods


def open_sockets() -> int:
    """This process's open sockets (the gateway's, the stand-in's and the clients'); files are left out, as the
    database opens them as it pleases."""
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):
            count += fd.readlink().name.startswith("socket:")
    return count


async def slowloris(url: str, *, send_anything: bool) -> tuple[bytes, float]:
    """A connection that sends part of a head and then waits (or sends nothing): what the gateway answers, and
    how long it kept the connection."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    opened = time.monotonic()
    try:
        if send_anything:
            writer.write(b"GET /proxy/openai/models HTTP/1.1\r\nHost: gw\r\nX-Slow: a")
        answer = await asyncio.wait_for(reader.read(), 5)
        return answer, time.monotonic() - opened
    finally:
        writer.close()


async def test_ls04_a_flood_of_slow_and_silent_connections_is_closed_at_the_head_timeout_and_others_are_served(
    served: Served, project: Project, upstream: Upstream
) -> None:
    """Scaled: 300 partial heads and 300 connections that send nothing, while a client makes 50 calls. (Idle
    keep-alive connections after a request are closed by uvicorn's keep-alive timeout, 5 s, not asserted here.)"""
    body = {"model": "m", "messages": []}
    url = f"{served.url}/proxy/openai/chat/completions"
    async with served.http.post(url, json=body, headers=bearer(project.token)) as response:
        assert response.status == 200  # warm: the outbound pool's connection to the upstream is open
    await served.http.close()
    baseline = open_sockets()
    flood = [asyncio.create_task(slowloris(served.url, send_anything=index % 2 == 0)) for index in range(600)]
    await asyncio.sleep(0.1)
    async with httpx.AsyncClient(headers=bearer(project.token)) as client:
        statuses = [(await client.post(url, json=body)).status_code for _ in range(50)]
    answers = await asyncio.gather(*flood)
    assert statuses == [200] * 50
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer, _ in answers)
    assert max(held for _, held in answers) < HEADER_TIMEOUT + 2.0  # 408 and end of stream at the timeout
    assert await eventually(lambda: open_sockets() <= baseline, within=2.0)


# LS-05 soak, LS-06 disconnect and error storms: bench/soak.py (FT-10's 200 streamed 429s run here).


# LS-07 slow upstream saturation


@pytest.fixture
async def pooled(settings: Settings, ctx: Context) -> AsyncIterator[str]:
    """The gateway with an outbound pool of 5 connections (1,000 in production)."""
    async with serving(create_app(settings, context=ctx, upstream_connections=5), settings) as url:
        yield url


async def test_ls07_a_slow_upstream_gets_at_most_the_pool_and_waiting_requests_end_at_the_timeout(
    pooled: str, ctx: Context, project: Project, catalogue: CatalogueUpstream
) -> None:
    """The pool caps the upstream's concurrency; waiting for a slot counts against `timeout_seconds`, so a
    saturated upstream gives 504s, not an unbounded queue. (The catalogue asks for a separate pool-acquire
    timeout answered 503; credgate has none.)"""
    url = pooled
    await add_custom(ctx, project, "stuck", catalogue.url, timeout_seconds=0.5)
    async with aiohttp.ClientSession() as http:

        async def burst() -> list[tuple[int, float, Any]]:
            calls = [timed_get(http, f"{url}/proxy/stuck/slow", bearer(project.token)) for _ in range(20)]
            return await asyncio.gather(*calls)

        catalogue.delay = 0.1  # slow, within the timeout: 20 calls go through 5 at a time
        queued = await burst()
        assert [status for status, _, _ in queued] == [200] * 20
        assert catalogue.peak_active == 5
        catalogue.delay = 2.0  # saturated: every call ends at the timeout, queued or not
        stuck = await burst()
        assert [status for status, _, _ in stuck] == [504] * 20
        assert max(seconds for _, seconds, _ in stuck) < 1.5
        catalogue.delay = 0.0  # the upstream recovers: normal at once
        recovered = await burst()
    assert [status for status, _, _ in recovered] == [200] * 20


# LS-08 rotation and revocation under load


async def test_ls08_key_and_token_rotations_under_load_fail_no_request_and_no_request_carries_an_old_key(
    served: Served, ctx: Context, project: Project, upstream: Upstream
) -> None:
    """Ten key rotations and a token rotation (with grace: both tokens in use after it) during a second of calls,
    10 at a time: every call succeeds, and each carries the key current when it started or a newer one."""
    await add_custom(ctx, project, "stand-in", upstream.url)
    keys: list[str] = []  # in the order they were set; the first is add_custom's, learned from a first call
    rotated_at: list[float] = [0.0]
    started: dict[str, float] = {}
    tokens = [project.token]
    failures: list[int] = []

    async def call(index: int) -> None:
        started[str(index)] = time.monotonic()
        url = f"{served.url}/proxy/stand-in/echo/{index}"
        async with served.http.get(url, headers=bearer(tokens[index % len(tokens)])) as response:
            if response.status != 200:
                failures.append(response.status)
            await response.read()

    async def load(until: float) -> None:
        for index in range(100_000):
            if time.monotonic() > until:
                return
            await asyncio.gather(*(call(index * 10 + lane) for lane in range(10)))

    await call(-1)
    keys.append(str(upstream.last.header("authorization")).removeprefix("Bearer "))
    running = asyncio.create_task(load(time.monotonic() + 1.0))
    for rotation in range(10):
        await asyncio.sleep(0.09)
        key = f"sk-ls08-{rotation}-" + secrets.token_urlsafe(12)
        SWEEP.register(key)
        await integrations.set_provider_key(ctx, project_id=project.id, provider="stand-in", api_key=key, actor="t")
        keys.append(key)
        rotated_at.append(time.monotonic())
        if rotation == 5:
            _, token = await projects.rotate_project_token(ctx, project_id=project.id, actor="t", grace_seconds=60)
            tokens.append(token)
    await running
    assert failures == []
    for received in upstream.received[1:]:
        index = received.path_qs.rsplit("/", 1)[1]
        used = keys.index(str(received.header("authorization")).removeprefix("Bearer "))
        current = max(n for n, moment in enumerate(rotated_at) if moment <= started[index])
        assert used >= current, f"request {index} carried key {used}, rotated to {current} before it started"
    await projects.revoke_project_tokens(ctx, project_id=project.id, actor="t")
    for token in tokens:  # revoked: refused at once
        async with served.http.get(f"{served.url}/proxy/stand-in/echo/x", headers=bearer(token)) as response:
            assert response.status == 401


# LS-09 large bodies


def gateway_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


async def upload(http: aiohttp.ClientSession, url: str, token: str, body: bytes, *, chunked: bool) -> dict[str, Any]:
    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 256 * 1024):
            yield body[start : start + 256 * 1024]

    data = pieces() if chunked else io.BytesIO(body)
    async with http.post(url, data=data, headers=bearer(token)) as response:
        assert response.status == 200
        answer: dict[str, Any] = await response.json()
        return answer


async def test_ls09_concurrent_large_uploads_arrive_byte_identical_and_are_not_held_in_memory(
    tmp_path: Path, catalogue: CatalogueUpstream
) -> None:
    """Eight 8 MiB bodies at once, half with Content-Length and half chunked, through `credgate serve`, while
    streams run: each arrives whole, and the gateway's memory grows by far less than the 64 MiB in flight."""
    popen, running = start_gateway(tmp_path / "data", tmp_path / "gateway.log")
    try:
        ctx = await open_context(Settings(data_dir=tmp_path / "data", allow_private_upstreams=True))
        try:
            created, token = await projects.create_project(ctx, name="uploads", actor="t")
            await add_custom(ctx, Project(created.id, token, ""), "sink", catalogue.url)
        finally:
            await ctx.database.dispose()
        bodies = [secrets.token_bytes(8 * 1024 * 1024) for _ in range(8)]
        url = f"{running.url}/proxy/sink/sha256"
        async with aiohttp.ClientSession() as http:
            await upload(http, url, token, bodies[0][:1024], chunked=True)  # warm
            before = peak = gateway_rss_kib(popen.pid)
            streams = f"{running.url}/proxy/sink/sse-varied?n=20&delay=0.05&id="
            uploads = asyncio.gather(
                *(upload(http, url, token, body, chunked=n % 2 == 0) for n, body in enumerate(bodies)),
                *(read_stream(http, f"{streams}{n}", token) for n in range(5)),
            )
            while not uploads.done():
                peak = max(peak, gateway_rss_kib(popen.pid))
                await asyncio.sleep(0.02)
            answers = await uploads
    finally:
        stop_gateway(popen, running)
    assert answers[:8] == [{"sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)} for body in bodies]
    assert [stream[0] for stream in answers[8:]] == [catalogue.sent[str(n)] for n in range(5)]
    delays = [delay for stream in answers[8:] for delay in stream[1]]
    assert percentile(delays, 0.99) < 0.1, f"p99 event delay {percentile(delays, 0.99) * 1000:.1f} ms during uploads"
    assert peak - before < 24 * 1024, f"RSS grew by {peak - before} KiB for 64 MiB of bodies"


# LS-10 per-project fairness


async def limit_beside_another(ctx: Context, project: Project, upstream: Upstream, limit: ProjectChanges) -> Project:
    """Give `project` the limit; returns another project on the same provider, with none."""
    other = await add_project(ctx, upstream)
    await projects.update_project(ctx, project_id=project.id, changes=limit, actor="t")
    return other


async def post_chat(served: Served, token: str) -> tuple[int, str | None]:
    """A chat completion through the gateway: its status and Retry-After."""
    url = f"{served.url}/proxy/openai/chat/completions"
    async with served.http.post(url, json={"model": "m", "messages": []}, headers=bearer(token)) as response:
        await response.read()
        return response.status, response.headers.get("retry-after")


async def test_ls10_a_project_over_its_rate_limit_gets_429s_while_another_is_served_in_full(
    served: Served, ctx: Context, project: Project, upstream: Upstream
) -> None:
    """The catalogue's cap on concurrent streams: test_ls10_a_project_at_its_cap_on_requests_under_way_…"""
    other = await limit_beside_another(ctx, project, upstream, ProjectChanges(rate_limit_per_minute=60))
    started = time.monotonic()
    greedy, modest = await asyncio.gather(
        asyncio.gather(*(post_chat(served, project.token) for _ in range(100))),
        asyncio.gather(*(post_chat(served, other.token) for _ in range(50))),
    )
    refill = int(time.monotonic() - started) + 1  # one more request a second while the burst lasts
    admitted = sum(status == 200 for status, _ in greedy)
    assert 60 <= admitted <= 60 + refill
    assert sorted(status for status, _ in greedy) == [200] * admitted + [429] * (100 - admitted)
    assert all(int(retry_after or 0) >= 1 for status, retry_after in greedy if status == 429)
    assert [status for status, _ in modest] == [200] * 50


HELD_STREAM: list[bytes | float] = [  # an event, then nothing until the gateway hangs up
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"d\r\ndata: first\n\n\r\n",
    3600.0,
]


async def test_ls10_a_project_at_its_cap_on_requests_under_way_gets_429s_while_another_is_served(
    served: Served, ctx: Context, project: Project, upstream: Upstream
) -> None:
    other = await limit_beside_another(ctx, project, upstream, ProjectChanges(max_concurrent_requests=3))
    async with run_watched_upstream(HELD_STREAM) as holding, contextlib.AsyncExitStack() as streams:
        await add_custom(ctx, project, "holding", holding.url)
        url = f"{served.url}/proxy/holding/v1/chat/completions"
        held = []
        for _ in range(3):
            response = await streams.enter_async_context(served.http.post(url, json={}, headers=bearer(project.token)))
            assert response.status == 200
            assert await response.content.readuntil(b"\n\n") == b"data: first\n\n"
            held.append(response)
        refused = [await timed_get(served.http, url, bearer(project.token)) for _ in range(5)]
        assert [status for status, _, _ in refused] == [429] * 5
        message = "3 requests of this project are already under way"
        assert [body for _, _, body in refused] == [({"error": {"status": 429, "message": message}}, "1")] * 5
        assert len(holding.asked) == 3  # a refused request never reached the provider
        answers = await asyncio.gather(*(post_chat(served, other.token) for _ in range(20)))
        assert [status for status, _ in answers] == [200] * 20

        held[0].close()  # one stream ends: its place serves the next request
        assert await eventually(lambda: len(holding.hang_ups) == 1, within=2.0)
        async with served.http.post(url, json={}, headers=bearer(project.token)) as again:
            assert again.status == 200
            assert await again.content.readuntil(b"\n\n") == b"data: first\n\n"
        async with served.http.post(url, json={}, headers=bearer(project.token)) as full:
            assert full.status == 429
    assert await eventually(lambda: served.proxy.in_flight == 0, within=2.0)  # the streams left: nothing held
    places = served.proxy.places
    assert isinstance(places, LocalPlaces)
    assert [places.take_now(project.id, 3) is not None for _ in range(4)] == [True] * 3 + [False]  # all back
