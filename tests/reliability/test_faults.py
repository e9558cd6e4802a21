"""Catalogue group FT: faults of the upstream, the client and the gateway's own dependencies."""

import time

import httpx
import pytest

from credgate.services.context import Context
from tests.e2e.conftest import Project, add_custom
from tests.upstream import run_raw_upstream

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def read_until_cut(url: str, token: str) -> tuple[list[bytes], float]:
    """Stream a response through the gateway; it must end abnormally. Returns the chunks and the time taken."""
    started = time.monotonic()
    chunks: list[bytes] = []

    async def read_all() -> None:
        async for chunk in response.aiter_raw():
            chunks.append(chunk)

    async with (
        httpx.AsyncClient(timeout=10) as client,
        client.stream("GET", url, headers={"Authorization": f"Bearer {token}"}) as response,
    ):
        assert response.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            await read_all()
    return chunks, time.monotonic() - started


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
