"""Streams over real sockets: broken upstreams, departing clients and what they leave behind, isolation
under concurrent load, the usage records, and the logs."""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import pytest

import credgate.proxy.relay
from credgate.proxy.upstreams import Upstreams
from credgate.services import admins
from credgate.services.context import Context
from tests.e2e.conftest import Project, add_custom, add_project, bearer
from tests.polling import eventually
from tests.upstream import Upstream

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def outbound(monkeypatch: pytest.MonkeyPatch) -> list[Upstreams]:
    """The gateway's upstream pools, as its proxy creates them (request it before `gateway_url`)."""
    made: list[Upstreams] = []

    def capture(**options: Any) -> Upstreams:
        made.append(Upstreams(**options))
        return made[-1]

    monkeypatch.setattr(credgate.proxy.relay, "Upstreams", capture)
    return made


@pytest.fixture
async def stand_in(ctx: Context, upstream: Upstream, project: Project) -> str:
    """`/proxy/stand-in/…`: every path of the stand-in upstream."""
    await add_custom(ctx, project, "stand-in", upstream.url)
    return "stand-in"


@pytest.fixture
async def http(gateway_url: str, project: Project) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway_url, headers=bearer(project.token), timeout=10) as client:
        yield client


# the upstream breaks


@pytest.mark.usefixtures("stand_in")
async def test_upstream_dying_mid_body_breaks_the_clients_response(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    async with http.stream("GET", "/proxy/stand-in/broken") as response:
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        with pytest.raises(httpx.TransportError):
            await response.aread()
    assert any(request_id in record.getMessage() for record in caplog.records if record.name.startswith("credgate"))


async def collect(response: httpx.Response, into: list[bytes]) -> None:
    async for chunk in response.aiter_raw():
        into.append(chunk)


async def test_chunked_upstream_dying_mid_stream_breaks_the_clients_response(
    http: httpx.AsyncClient, ctx: Context, project: Project
) -> None:
    async def die_after_one_event(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        writer.write(head + b"b\r\ndata: one\n\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()

    server = await asyncio.start_server(die_after_one_event, "127.0.0.1", 0)
    async with server:
        await add_custom(ctx, project, "dying", f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        async with http.stream("GET", "/proxy/dying/events") as response:
            received: list[bytes] = []
            with pytest.raises(httpx.TransportError):
                await collect(response, received)
    assert b"".join(received) == b"data: one\n\n"


# the client leaves


async def leave_after_first_chunk(client: httpx.AsyncClient, url: str) -> None:
    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        async for _ in response.aiter_raw():
            break


@pytest.mark.usefixtures("stand_in")
async def test_client_leaving_mid_stream_closes_the_upstream_stream(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    await leave_after_first_chunk(http, "/proxy/stand-in/sse?n=100&delay=0.1")
    assert await eventually(lambda: upstream.open_streams == 0, within=1.0)
    assert len(upstream.received) == 1


async def test_client_leaving_before_the_upstream_answers_closes_the_upstream_connection(
    http: httpx.AsyncClient, ctx: Context, project: Project
) -> None:
    asked, hung_up = asyncio.Event(), asyncio.Event()

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        asked.set()
        await reader.read()  # b"" once the gateway hangs up
        hung_up.set()
        writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    async with server:
        # The upstream timeout (3 s) bounds how long a gateway that does not notice keeps the connection.
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        await add_custom(ctx, project, "silent", url, timeout_seconds=3.0)
        request = asyncio.create_task(http.post("/proxy/silent/v1/chat/completions", json=CHAT, timeout=30))
        await asyncio.wait_for(asked.wait(), 10)  # the upstream has the request; now the client leaves
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await request
        assert await eventually(hung_up.is_set, within=1.0), "the gateway still waits on the upstream"


async def test_a_thousand_departing_clients_leave_nothing_behind(
    outbound: list[Upstreams], stand_in: str, http: httpx.AsyncClient, upstream: Upstream
) -> None:
    url = "/proxy/stand-in/sse?n=1000&delay=0.05"
    await leave_after_first_chunk(http, url)
    assert await eventually(lambda: upstream.open_streams == 0, within=1.0)
    baseline = len(asyncio.all_tasks())
    started = time.monotonic()
    for _ in range(20):
        await asyncio.gather(*(leave_after_first_chunk(http, url) for _ in range(50)))
    elapsed = time.monotonic() - started
    pool = outbound[0].connections
    assert await eventually(lambda: upstream.open_streams == 0, within=2.0)
    assert await eventually(lambda: pool.in_use == 0, within=1.0)
    assert await eventually(lambda: len(asyncio.all_tasks()) <= baseline, within=2.0)
    assert len(upstream.received) == 1001
    assert elapsed < 30


@pytest.mark.usefixtures("stand_in")
async def test_broken_upstreams_leave_nothing_behind(outbound: list[Upstreams], http: httpx.AsyncClient) -> None:
    async def read_broken() -> None:
        with pytest.raises(httpx.TransportError):
            await http.get("/proxy/stand-in/broken")

    await asyncio.gather(*(read_broken() for _ in range(100)))
    pool = outbound[0].connections
    assert await eventually(lambda: pool.in_use == 0, within=1.0)


# isolation


async def test_concurrent_projects_each_reach_the_upstream_with_their_own_key(
    gateway_url: str, ctx: Context, upstream: Upstream
) -> None:
    first, second = await add_project(ctx, upstream), await add_project(ctx, upstream)
    keys = {first.id: first.key, second.id: second.key}

    async def call(client: aiohttp.ClientSession, project: Project, index: int) -> None:
        model = f"{project.id}/{index}"
        async with client.post(
            f"{gateway_url}/proxy/openai/chat/completions", json={**CHAT, "model": model}, headers=bearer(project.token)
        ) as response:
            assert response.status == 200
            assert (await response.json())["model"] == model

    # aiohttp as the load client: httpx's pool is quadratic in waiting requests and would be the bottleneck.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=400)) as client:
        await asyncio.gather(*(call(client, project, n) for n in range(200) for project in (first, second)))
    assert len(upstream.received) == 400
    for received in upstream.received:
        project_id = json.loads(received.body)["model"].split("/")[0]
        assert received.header("authorization") == f"Bearer {keys[project_id]}"


# usage


@pytest.fixture
async def admin(gateway_url: str, ctx: Context) -> AsyncIterator[httpx.AsyncClient]:
    token = await admins.create_admin_token(ctx, name="usage", actor="t")
    async with httpx.AsyncClient(base_url=f"{gateway_url}/api/v1", headers=bearer(token)) as client:
        yield client


def our_request_id(response: httpx.Response) -> str:
    """The gateway's request id (the stand-in's chat answers carry an X-Request-Id of their own, relayed)."""
    ids = response.headers.get_list("x-credgate-request-id")
    assert len(ids) == 1
    return ids[0]


async def records_of(admin: httpx.AsyncClient, project: Project, count: int) -> list[dict[str, Any]]:
    """The project's request records, newest first, once `count` are listed or one second has passed."""
    deadline = time.monotonic() + 1.0  # the README's promise: listed within one second of the request's end
    for _ in range(100):
        items: list[dict[str, Any]] = (await admin.get(f"/projects/{project.id}/requests")).json()["items"]
        if len(items) >= count or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    return items


RECORDED = ("request_id", "method", "provider", "endpoint", "status", "request_bytes", "response_bytes")
TOKENS = ("prompt_tokens", "completion_tokens")


def expected_record(request: httpx.Request, response: httpx.Response) -> dict[str, Any]:
    return {
        "request_id": our_request_id(response),
        "method": request.method,
        "provider": "openai",
        "endpoint": "chat/completions",
        "status": response.status_code,
        "request_bytes": len(request.content),
        "response_bytes": len(response.content),
    }


async def test_requests_are_recorded_with_bytes_and_tokens_within_a_second(
    http: httpx.AsyncClient, admin: httpx.AsyncClient, project: Project
) -> None:
    bodies: list[dict[str, Any]] = [
        CHAT,
        {**CHAT, "stream": True, "stream_options": {"include_usage": True}},
        {**CHAT, "stream": True},
    ]
    sent = [http.build_request("POST", "/proxy/openai/chat/completions", json=body) for body in bodies]
    responses = [await http.send(request) for request in sent]
    assert [response.status_code for response in responses] == [200, 200, 200]
    tokens = [(9, 3), (5, 3), (None, None)]  # JSON usage; the last SSE event's usage; none asked for
    expected = [
        expected_record(request, response) | dict(zip(TOKENS, counts, strict=True))
        for request, response, counts in zip(sent, responses, tokens, strict=True)
    ]
    items = await records_of(admin, project, 3)
    assert [{name: item[name] for name in RECORDED + TOKENS} for item in items] == expected[::-1]
    assert all(item["duration_ms"] > 0 for item in items)
    usage = (await admin.get(f"/projects/{project.id}/usage")).json()["totals"]
    assert usage == {"requests": 3, "errors": 0, "prompt_tokens": 14, "completion_tokens": 6, "total_tokens": 20}


async def test_service_errors_are_recorded_as_errors(
    http: httpx.AsyncClient, admin: httpx.AsyncClient, project: Project
) -> None:
    request = http.build_request("GET", "/proxy/openai/chat/completions")
    response = await http.send(request)
    assert response.status_code == 403
    items = await records_of(admin, project, 1)
    assert [{name: item[name] for name in RECORDED} for item in items] == [expected_record(request, response)]
    usage = (await admin.get(f"/projects/{project.id}/usage")).json()["totals"]
    assert (usage["requests"], usage["errors"]) == (1, 1)


# secrets in logs


@pytest.mark.usefixtures("stand_in")
async def test_no_log_line_holds_the_project_token_or_the_provider_key(
    http: httpx.AsyncClient, project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await http.post("/proxy/openai/chat/completions", json=CHAT)
    await http.post("/proxy/openai/chat/completions", json={**CHAT, "stream": True})
    await http.get("/proxy/openai/chat/completions")
    await http.get("/proxy/nothere/x")
    await http.get("/proxy/stand-in/echo/x", headers={"x-api-key": project.token, "Cookie": f"t={project.token}"})
    await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(project.token + "x"))
    with pytest.raises(httpx.TransportError):
        await http.get("/proxy/stand-in/broken")
    records = caplog.get_records("setup") + caplog.records
    # httpx and httpcore log the test client's side of the exchange, not the gateway's.
    gateway_side = [record for record in records if not record.name.startswith(("httpx", "httpcore"))]
    assert any(record.name.startswith("credgate") for record in gateway_side)
    formatter = logging.Formatter("%(name)s %(message)s")
    for record in gateway_side:
        line = formatter.format(record)
        assert project.token not in line
        assert project.token[4:] not in line
        assert project.key not in line
