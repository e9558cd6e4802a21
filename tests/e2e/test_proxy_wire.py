"""The wire, raw: bodies byte for byte both ways, every method, queries and paths as written, and the
hygiene of what reaches the upstream and what comes back."""

import asyncio
import gzip
import hashlib
import json
import os
import secrets
from collections.abc import AsyncIterator

import httpx
import pytest

from credgate.services import integrations
from credgate.services.context import Context
from credgate.specs import Endpoint
from tests.e2e.conftest import Project
from tests.secret_sweep import SWEEP
from tests.upstream import Upstream

KEY = "sk-wire-" + secrets.token_urlsafe(18)
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@pytest.fixture
async def proxy(
    ctx: Context, upstream: Upstream, project: Project, gateway_url: str
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `/proxy/wire/`, a custom integration at the stand-in's root: `* echo/**` and GET gzip,
    binary and sse. It sends no Accept-Encoding of its own, so what the upstream gets is the test's."""
    SWEEP.register(KEY)
    await integrations.add_custom_integration(
        ctx, project_id=project.id, provider="wire", base_url=upstream.url, api_key=KEY, actor="t"
    )
    endpoints = [Endpoint(method="*", path="echo/**")] + [
        Endpoint(method="GET", path=path) for path in ("gzip", "binary", "sse")
    ]
    await integrations.set_endpoints(ctx, project_id=project.id, provider="wire", endpoints=endpoints, actor="t")
    headers = {"Authorization": f"Bearer {project.token}"}
    async with httpx.AsyncClient(base_url=f"{gateway_url}/proxy/wire/", headers=headers) as client:
        del client.headers["accept-encoding"]
        yield client


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# bodies


async def test_multipart_upload_is_relayed_byte_exact(proxy: httpx.AsyncClient, upstream: Upstream) -> None:
    files = {"file": ("audio.mp3", os.urandom(200_000), "audio/mpeg")}
    request = proxy.build_request("POST", "echo/audio/transcriptions", data={"model": "whisper-1"}, files=files)
    sent = await request.aread()
    response = await proxy.send(request)
    assert response.status_code == 200
    assert sha256(upstream.last.body) == sha256(sent)
    assert upstream.last.header("content-type") == request.headers["content-type"]


async def test_binary_upload_is_relayed_byte_exact(proxy: httpx.AsyncClient, upstream: Upstream) -> None:
    data = os.urandom(3 * 1024 * 1024)
    response = await proxy.post("echo/upload", content=data, headers={"Content-Type": "application/octet-stream"})
    assert response.json()["body_length"] == len(data)
    assert sha256(upstream.last.body) == sha256(data)
    assert upstream.last.header("content-length") == str(len(data))


async def test_chunked_upload_is_streamed_byte_exact(proxy: httpx.AsyncClient, upstream: Upstream) -> None:
    pieces = [os.urandom(64 * 1024) for _ in range(20)]

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    response = await proxy.put("echo/upload", content=body())
    assert response.status_code == 200
    assert sha256(upstream.last.body) == sha256(b"".join(pieces))


async def test_request_body_reaches_the_upstream_before_the_client_has_sent_it_all(
    ctx: Context, project: Project, gateway_url: str
) -> None:
    """Streamed, not buffered: the client sends its second piece only once the upstream has the first."""
    first_arrived = asyncio.Event()

    async def read_first_piece(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"FIRST")
        first_arrived.set()
        await reader.readuntil(b"SECOND")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def body() -> AsyncIterator[bytes]:
        yield b"FIRST"
        await asyncio.wait_for(first_arrived.wait(), timeout=2)
        yield b"SECOND"

    server = await asyncio.start_server(read_first_piece, "127.0.0.1", 0)
    async with server:
        base_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        await integrations.add_custom_integration(
            ctx, project_id=project.id, provider="sink", base_url=base_url, api_key=KEY, actor="t"
        )
        endpoints = [Endpoint(method="POST", path="upload")]
        await integrations.set_endpoints(ctx, project_id=project.id, provider="sink", endpoints=endpoints, actor="t")
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {project.token}"}) as client:
            response = await client.post(f"{gateway_url}/proxy/sink/upload", content=body())
    assert response.status_code == 200
    assert response.content == b"ok"


async def test_a_client_that_expects_100_continue_gets_it_then_its_body_is_relayed(
    proxy: httpx.AsyncClient, upstream: Upstream, project: Project, gateway_url: str
) -> None:
    """As curl does for a large upload: the head alone, the body only once the gateway says to go on."""
    body = os.urandom(4096)
    host, port = gateway_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            f"POST /proxy/wire/echo/upload HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {project.token}\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-Continue\r\nConnection: close\r\n\r\n".encode()
        )
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        answer = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        await writer.wait_closed()
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert upstream.last.body == body


async def test_binary_download_is_relayed_byte_exact(proxy: httpx.AsyncClient) -> None:
    response = await proxy.get("binary")
    assert response.headers["content-type"] == "audio/mpeg"
    assert sha256(response.content) == sha256(bytes(range(256)) * 4096)


async def test_gzip_response_is_relayed_still_compressed(proxy: httpx.AsyncClient, upstream: Upstream) -> None:
    async with proxy.stream("GET", "gzip", headers={"Accept-Encoding": "gzip"}) as response:
        raw = b"".join([chunk async for chunk in response.aiter_raw()])
    assert response.headers["content-encoding"] == "gzip"
    assert response.headers["content-length"] == str(len(raw))
    assert raw[:2] == b"\x1f\x8b"
    assert gzip.decompress(raw) == b'{"compressed": true}'
    assert upstream.last.header("accept-encoding") == "gzip"


async def test_no_accept_encoding_upstream_unless_the_client_sent_one(
    proxy: httpx.AsyncClient, upstream: Upstream
) -> None:
    await proxy.get("gzip")
    assert "accept-encoding" not in upstream.last.header_names()
    await proxy.get("echo/x", headers={"Accept-Encoding": "br"})
    assert upstream.last.header("accept-encoding") == "br"


# methods, paths and queries


@pytest.mark.parametrize("method", METHODS)
async def test_every_method_reaches_the_upstream(proxy: httpx.AsyncClient, method: str) -> None:
    body = b"" if method == "GET" else b'{"n": 1}'
    response = await proxy.request(method, "echo/items/1", content=body)
    assert response.status_code == 200
    echoed = response.json()
    assert (echoed["method"], echoed["path_qs"], echoed["body_length"]) == (method, "/echo/items/1", len(body))


@pytest.mark.parametrize(
    "query",
    [
        "a=1&a=2&a=3",
        "q=hello+world&r=hello%20world",
        "path=%2Fetc%2Fpasswd&check=%E2%9C%93&lower=%2f",
        "flag&empty=&eq=a=b",
        "filter[name]=x&sort=-created_at",
        "semi=1;2&pct=%25&B=1&b=2",
        "x=1&&y=2&",
    ],
)
async def test_query_string_is_forwarded_verbatim(proxy: httpx.AsyncClient, upstream: Upstream, query: str) -> None:
    response = await proxy.get(f"echo/search?{query}")
    assert response.status_code == 200
    assert upstream.last.path_qs == f"/echo/search?{query}"


@pytest.mark.parametrize(
    "endpoint",
    ["echo/a", "echo/a/b/c/d/e/f/g/h", "echo/files/file-abc/content", "echo/a%20b/c%3Ad/%E2%9C%93", "echo/v1:batch"],
)
async def test_multi_segment_endpoints_are_joined_as_written(
    proxy: httpx.AsyncClient, upstream: Upstream, endpoint: str
) -> None:
    response = await proxy.post(endpoint, json={})
    assert response.status_code == 200
    assert upstream.last.path_qs == f"/{endpoint}"


# hygiene


async def test_upstream_gets_the_key_and_none_of_the_clients_private_headers(
    proxy: httpx.AsyncClient, upstream: Upstream, project: Project
) -> None:
    private = {
        "Cookie": "session=s3cr3t",
        "X-Forwarded-For": "203.0.113.7",
        "X-Forwarded-Host": "app.example",
        "X-Forwarded-Proto": "https",
        "Forwarded": "for=203.0.113.7",
        "X-Real-IP": "203.0.113.7",
        "X-Api-Key": project.token,
        "Proxy-Authorization": "Basic eDp5",
    }
    await proxy.post("echo/x", json={}, headers={**private, "X-Custom": "kept", "Connection": "keep-alive, X-Custom"})
    received = upstream.last
    assert [value for name, value in received.headers if name.lower() == "authorization"] == [f"Bearer {KEY}"]
    assert received.header_names().isdisjoint(name.lower() for name in [*private, "X-Custom"])
    assert not any(name.startswith("x-forwarded-") for name in received.header_names())
    assert project.token not in json.dumps(received.headers) + received.path_qs
    assert "203.0.113.7" not in json.dumps(received.headers)


async def test_end_to_end_headers_reach_the_upstream(proxy: httpx.AsyncClient, upstream: Upstream) -> None:
    sent = {"User-Agent": "sdk/1.0", "Accept": "application/json", "OpenAI-Beta": "assistants=v2", "X-Trace": "t1"}
    await proxy.post("echo/x", json={}, headers=sent)
    for name, value in sent.items():
        assert upstream.last.header(name) == value


async def test_upstream_host_header_names_the_upstream(proxy: httpx.AsyncClient, upstream: Upstream) -> None:
    await proxy.get("echo/x")
    assert upstream.last.header("host") == upstream.url.removeprefix("http://")


async def test_event_streams_carry_x_accel_buffering_no(proxy: httpx.AsyncClient) -> None:
    response = await proxy.get("sse", params={"n": "2", "delay": "0"})
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers.get_list("x-accel-buffering") == ["no"]
    assert response.text.count("data: ") == 2
    assert "x-accel-buffering" not in (await proxy.get("echo/x")).headers


@pytest.mark.parametrize("path", ["echo/x", "sse?n=1&delay=0", "binary"])
async def test_no_duplicate_date_or_server_headers(proxy: httpx.AsyncClient, path: str) -> None:
    response = await proxy.get(path)
    assert response.status_code == 200
    assert len(response.headers.get_list("date")) == 1
    assert len(response.headers.get_list("server")) <= 1
    assert len(response.headers.get_list("x-request-id")) == 1


async def test_relayed_response_keeps_the_upstreams_headers(proxy: httpx.AsyncClient, upstream: Upstream) -> None:
    relayed = await proxy.get("binary")
    async with httpx.AsyncClient() as client:
        direct = await client.get(f"{upstream.url}/binary")
    ignored = {"date", "x-request-id", "x-credgate-request-id"}
    assert [pair for pair in relayed.headers.multi_items() if pair[0] not in ignored] == [
        pair for pair in direct.headers.multi_items() if pair[0] not in ignored
    ]
