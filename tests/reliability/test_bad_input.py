"""Catalogue group BI: bad input and protocol abuse from a hostile client, over real sockets."""

import asyncio
from pathlib import Path

import httpx
import pytest

from credgate.config import Settings
from credgate.services.context import Context
from tests.e2e.conftest import Project, add_custom, start_gateway, stop_gateway
from tests.upstream import Upstream

HEAD_LIMIT = 8192


@pytest.fixture
def settings(database: tuple[str, dict[str, object]], tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database[0],
        allow_private_upstreams=True,
        max_header_bytes=HEAD_LIMIT,
        header_timeout_seconds=0.5,
        max_request_bytes=1024 * 1024,
        client_body_timeout_seconds=0.5,
    )


async def exchange(gateway_url: str, request: bytes, *, read_for: float = 5.0) -> bytes:
    """Send raw bytes, return everything the gateway answers until it closes (or `read_for` passes)."""
    host, port = gateway_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        chunks = []
        try:
            async with asyncio.timeout(read_for):
                while chunk := await reader.read(65536):
                    chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)
    finally:
        writer.close()


def head(path: str, *lines: str, method: str = "GET") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: gateway\r\n" + "".join(f"{line}\r\n" for line in lines) + "\r\n"
    ).encode()


async def test_bi01_a_header_block_over_the_limit_gets_431_in_the_envelope_before_the_token(
    gateway_url: str, project: Project, upstream: Upstream
) -> None:
    big = "X-Filler: " + "a" * HEAD_LIMIT
    answer = await exchange(gateway_url, head("/proxy/openai/models", f"Authorization: Bearer {project.token}", big))
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b"x-credgate-error: true" in answer
    assert answer.endswith(
        b'{"error": {"status": 431, "message": "request line and headers over the limit of 8192 bytes"}}'
    )
    assert upstream.received == []


async def test_bi01_a_long_request_line_counts_against_the_same_limit_on_every_route(gateway_url: str) -> None:
    answer = await exchange(gateway_url, head("/api/v1/projects?" + "q" * HEAD_LIMIT))
    assert answer.startswith(b"HTTP/1.1 431 ")


async def test_bi01_more_than_100_headers_get_431(gateway_url: str, project: Project, upstream: Upstream) -> None:
    lines = [f"X-H{index}: v" for index in range(101)]
    answer = await exchange(gateway_url, head("/proxy/openai/models", f"Authorization: Bearer {project.token}", *lines))
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert upstream.received == []


async def test_bi01_a_head_just_under_the_limit_is_served_and_its_body_is_not_counted(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_custom(ctx, project, "stand-in", upstream.url)
    body = b"b" * 50_000  # arrives with the head, in the same reads: the body is not head
    filler = "X-Filler: " + "a" * (HEAD_LIMIT - 300)
    request = head(
        "/proxy/stand-in/echo/x",
        f"Authorization: Bearer {project.token}",
        filler,
        f"Content-Length: {len(body)}",
        "Connection: close",
        method="POST",
    )
    answer = await exchange(gateway_url, request + body)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert upstream.last.body == body


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


async def send_endless_head(url: str) -> bytes:
    """A head that never ends, written in 64 KiB pieces until the gateway stops reading; then its answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /proxy/openai/models HTTP/1.1\r\nHost: gateway\r\nX-Filler: ")
    piece = b"a" * 65536
    try:
        for _ in range(128):  # 8 MiB at most
            writer.write(piece)
            await asyncio.wait_for(writer.drain(), 2)
    except (ConnectionError, TimeoutError):
        pass
    try:
        return await asyncio.wait_for(reader.read(4096), 5)
    except ConnectionError:
        return b""
    finally:
        writer.close()


def test_bi01_huge_heads_in_parallel_leave_the_gateway_memory_bounded(tmp_path: Path) -> None:
    """Twenty clients each sending an endless header to `credgate serve`: refused at the limit, nothing buffered
    (before the limit existed, a few such clients grew the process by hundreds of MiB)."""
    process, running = start_gateway(tmp_path / "data", tmp_path / "gateway.log")
    try:

        async def flood() -> list[bytes]:
            return await asyncio.gather(*(send_endless_head(running.url) for _ in range(20)))

        before = rss_kib(process.pid)
        answers = asyncio.run(flood())
        after = rss_kib(process.pid)
    finally:
        stop_gateway(process, running)
    assert sum(answer.startswith(b"HTTP/1.1 431 ") for answer in answers) >= 15  # the rest may see a reset
    assert after - before < 8 * 1024, f"RSS grew by {after - before} KiB"


async def test_bi02_a_head_sent_too_slowly_gets_408_and_the_connection_closes(gateway_url: str) -> None:
    answer = await exchange(gateway_url, b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Slow: ", read_for=3)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"the request head was not sent in time" in answer


async def test_bi02_a_connection_that_sends_nothing_is_closed_at_the_head_timeout(gateway_url: str) -> None:
    answer = await exchange(gateway_url, b"", read_for=3)
    assert answer.startswith(b"HTTP/1.1 408 ")


async def test_bi02_keep_alive_requests_each_get_their_own_head_budget(gateway_url: str) -> None:
    filler = "X-Filler: " + "a" * (HEAD_LIMIT - 200)
    async with httpx.AsyncClient() as client:
        for _ in range(5):  # 5 × (limit - 200) on one connection: each head alone is under the limit
            response = await client.get(f"{gateway_url}/healthz", headers={"X-Filler": filler[10:]})
            assert response.status_code == 200
