"""Regressions from the security review, over real sockets."""

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from credgate.config import Settings
from credgate.services.context import Context
from tests.e2e.conftest import Project, add_custom
from tests.polling import eventually
from tests.upstream import Upstream


@pytest.fixture
def settings(database: tuple[str, dict[str, object]], tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database[0],
        client_body_timeout_seconds=0.5,
        allow_private_upstreams=True,
    )


async def raw_request(
    gateway_url: str, *pieces: bytes, pause: float = 0.1
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = gateway_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(pause)
    return reader, writer


async def test_a_client_that_sent_its_body_in_pieces_and_leaves_mid_stream_frees_the_upstream(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_custom(ctx, project, "stand-in", upstream.url)
    head = (
        "GET /proxy/stand-in/sse?n=1000&delay=0.05 HTTP/1.1\r\nHost: gateway\r\n"
        f"Authorization: Bearer {project.token}\r\nContent-Length: 10\r\n\r\n"
    ).encode()
    reader, writer = await raw_request(gateway_url, head + b"12345", b"67890")
    await reader.readuntil(b"data:")
    assert upstream.open_streams == 1
    writer.close()
    assert await eventually(lambda: upstream.open_streams == 0, within=1.0), "the upstream stream runs on"


async def test_a_client_that_stalls_mid_body_gets_408_in_the_envelope(gateway_url: str, project: Project) -> None:
    head = (
        "POST /proxy/openai/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {project.token}\r\nContent-Length: 100\r\n\r\n"
    ).encode()
    reader, writer = await raw_request(gateway_url, head + b'{"model": ')
    response = await asyncio.wait_for(reader.read(4096), 5)
    writer.close()
    assert response.startswith(b"HTTP/1.1 408 ")
    assert b"x-credgate-error: true" in response.lower()
    assert b'{"error": {"status": 408, "message": "the request body was not sent in time"}}' in response


async def test_the_access_log_cannot_be_forged_with_an_encoded_line_break(
    gateway_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="credgate.access")
    async with httpx.AsyncClient() as client:
        await client.get(f"{gateway_url}/api/v1/x%0d%0a2026-01-01 INFO credgate.access: forged")
    lines = [record.getMessage() for record in caplog.records if record.name == "credgate.access"]
    assert any("x%0d%0a" in line for line in lines)
    assert not any("\n" in line or "\r" in line for line in lines)


async def test_an_encoded_proxy_prefix_does_not_reach_the_proxy(
    gateway_url: str, project: Project, upstream: Upstream
) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{gateway_url}/%70roxy/openai/chat/completions",
            json={"model": "m"},
            headers={"Authorization": f"Bearer {project.token}"},
        )
    assert (response.status_code, response.headers["x-credgate-error"]) == (404, "true")
    assert upstream.received == []


async def test_made_up_tokens_and_long_provider_names_do_not_grow_the_cache(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    long_name = "p" * 5000
    async with httpx.AsyncClient() as client:
        for _ in range(3):  # again if the change follower's first read cleared the cache meanwhile
            generation = ctx.access.generation
            for index in range(50):
                await client.get(f"{gateway_url}/proxy/{long_name}/x", headers={"Authorization": f"Bearer cgp_{index}"})
            if ctx.access.generation == generation:
                break
        bad = await client.get(
            f"{gateway_url}/proxy/{long_name}/x", headers={"Authorization": f"Bearer {project.token}"}
        )
    assert bad.status_code == 400
    assert all(len(provider) <= 63 for _, provider in ctx.access.entries)
    assert len(ctx.access.unknown) == 50
