"""Catalogue group BI: bad input and protocol abuse from a hostile client, over real sockets."""

import asyncio
import hashlib
from pathlib import Path

import httpx
import pytest

from credgate.app import create_app
from credgate.config import Settings
from credgate.services import integrations
from credgate.services.context import Context
from credgate.specs import Endpoint, QueryAuth
from tests.e2e.conftest import Project, add_custom, serving, start_gateway, stop_gateway
from tests.upstream import Upstream, run_raw_upstream

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


async def test_bi01_headers_sent_one_a_write_get_431_before_the_head_ends(
    gateway_url: str, project: Project, upstream: Upstream
) -> None:
    """Counted as they are parsed, not once the head is complete: a head that never ends (408 were the count left
    to its end) still cannot make the parser keep more than 100 headers."""
    host, port = gateway_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head("/proxy/openai/models", f"Authorization: Bearer {project.token}")[:-2])  # no end
        for index in range(150):
            writer.write(f"X-H{index}: v\r\n".encode())
            await writer.drain()
            await asyncio.sleep(0.001)  # a read each, as far as the loop goes
        answer = await asyncio.wait_for(reader.read(4096), 5)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b"more than 100 request headers" in answer
    assert upstream.received == []


async def test_bi01_a_hundred_headers_are_served(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_custom(ctx, project, "stand-in", upstream.url)
    lines = [f"X-H{index}: v" for index in range(97)]  # with Host, Authorization and Connection: 100
    request = head("/proxy/stand-in/echo/x", f"Authorization: Bearer {project.token}", *lines, "Connection: close")
    answer = await exchange(gateway_url, request)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert len(upstream.received) == 1


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


def test_bi01_heads_of_thousands_of_tiny_headers_in_parallel_leave_the_gateway_memory_bounded(tmp_path: Path) -> None:
    """Twenty clients each sending 16,000 headers of 4 bytes in one read (within the 64 KiB a head may take): the
    parse stops at the 101st. Counting each read's headers after it was parsed instead (a call a header less for
    every request) let each read keep about 2 MB of them: 38 MB here, 18 MB even with the refused head's dropped."""
    process, running = start_gateway(tmp_path / "data", tmp_path / "gateway.log")
    try:

        async def tiny_headers() -> bytes:
            host, port = running.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(b"GET /healthz HTTP/1.1\r\n" + b"a:\r\n" * 16_000)
                return await asyncio.wait_for(reader.read(4096), 5)
            finally:
                writer.close()

        async def flood() -> list[bytes]:
            return await asyncio.gather(*(tiny_headers() for _ in range(20)))

        before = rss_kib(process.pid)
        answers = asyncio.run(flood())
        after = rss_kib(process.pid)
    finally:
        stop_gateway(process, running)
    assert all(answer.startswith(b"HTTP/1.1 431 ") for answer in answers)
    assert all(b"more than 100 request headers" in answer for answer in answers)
    assert after - before < 8 * 1024, f"RSS grew by {after - before} KiB"


async def test_bi02_a_head_sent_too_slowly_gets_408_and_the_connection_closes(gateway_url: str) -> None:
    answer = await exchange(gateway_url, b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Slow: ", read_for=3)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"the request head was not sent in time" in answer


async def test_bi02_the_next_head_on_a_kept_alive_connection_is_timed_from_its_first_byte(gateway_url: str) -> None:
    """A head that comes whole arms no timer: the one after it, sent slowly on the same connection, is still cut at
    the timeout (0.5 s here), counted from its first byte, not from the idle time before it (1 s)."""
    host, port = gateway_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head("/healthz"))
        first = await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), 5)
        await asyncio.sleep(1.0)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Slow: ")
        await writer.drain()
        started = asyncio.get_running_loop().time()
        second = await asyncio.wait_for(reader.read(65536), 5)
        waited = asyncio.get_running_loop().time() - started
    finally:
        writer.close()
    assert first.startswith(b"HTTP/1.1 200 ")
    assert second.startswith(b"HTTP/1.1 408 ")
    assert b"the request head was not sent in time" in second
    assert 0.3 < waited < 2.0


async def test_bi02_a_connection_that_sends_nothing_is_closed_at_the_head_timeout(gateway_url: str) -> None:
    answer = await exchange(gateway_url, b"", read_for=3)
    assert answer.startswith(b"HTTP/1.1 408 ")


async def test_bi02_keep_alive_requests_each_get_their_own_head_budget(gateway_url: str) -> None:
    filler = "X-Filler: " + "a" * (HEAD_LIMIT - 200)
    async with httpx.AsyncClient() as client:
        for _ in range(5):  # 5 × (limit - 200) on one connection: each head alone is under the limit
            response = await client.get(f"{gateway_url}/healthz", headers={"X-Filler": filler[10:]})
            assert response.status_code == 200


async def test_bi02_a_declared_body_over_the_limit_gets_413_before_any_of_it_is_sent(
    gateway_url: str, project: Project, upstream: Upstream
) -> None:
    request = head(
        "/proxy/openai/chat/completions",
        f"Authorization: Bearer {project.token}",
        f"Content-Length: {11 * 1024 * 1024}",
        method="POST",
    )
    answer = await exchange(gateway_url, request, read_for=2)  # the body never comes: the answer must not wait
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert upstream.received == []


async def test_bi02_a_chunked_body_growing_past_the_limit_gets_413_and_is_cut_upstream(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_custom(ctx, project, "stand-in", upstream.url)
    piece = b"x" * 65536
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    request = head(
        "/proxy/stand-in/echo/x", f"Authorization: Bearer {project.token}", "Transfer-Encoding: chunked", method="POST"
    )
    answer = await exchange(gateway_url, request + chunk * 20, read_for=3)  # 1.25 MiB against a 1 MiB limit
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert all(len(received.body) <= 1024 * 1024 for received in upstream.received)
    # The slow body (BI-02c, 408) is tests/e2e/test_proxy_hardening.py::test_a_client_that_stalls_mid_body_…


SMUGGLING = [
    "Content-Length: 5\r\nTransfer-Encoding: chunked",
    "Content-Length: 5\r\nContent-Length: 6",
    "Transfer-Encoding: chunked, identity",
    "X-Folded: a\r\n b",
    "X-Nul: a\x00b",
    "X-Bare-Cr: a\rb",
]


@pytest.mark.parametrize("headers", SMUGGLING)
async def test_bi03_ambiguous_framing_or_control_characters_get_400_and_the_pipelined_request_is_dropped(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, headers: str
) -> None:
    await add_custom(ctx, project, "stand-in", upstream.url)
    first = head("/proxy/stand-in/echo/first", f"Authorization: Bearer {project.token}", headers, method="POST")
    second = head("/proxy/stand-in/echo/second", f"Authorization: Bearer {project.token}")
    answer = await exchange(gateway_url, first + b"0\r\n\r\n" + second, read_for=3)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert answer.count(b"HTTP/1.1 ") == 1  # the connection closed: the pipelined request was never served
    assert upstream.received == []


async def test_bi03_a_bare_lf_in_a_chunk_size_line_gets_400(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_custom(ctx, project, "stand-in", upstream.url)
    request = head(
        "/proxy/stand-in/echo/x", f"Authorization: Bearer {project.token}", "Transfer-Encoding: chunked", method="POST"
    )
    answer = await exchange(gateway_url, request + b"5\nhello\r\n0\r\n\r\n", read_for=3)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert all(received.body != b"hello" for received in upstream.received)


@pytest.mark.parametrize(
    "endpoint",
    [
        "models/..;/admin",
        "models/..%3b/admin",
        "models/%2e%2e%3Bx=y/admin",
        "models/.../admin",
        "models/%2e%2e%20/admin",
        "models/a%zz",
        "models/%00",
        "models/a%0d%0aX-Injected:%201",
        "../" * 1000 + "x",
    ],
)
async def test_bi04_path_parameters_and_lenient_dot_forms_never_pass_an_allow_list(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, endpoint: str
) -> None:
    await add_custom(ctx, project, "stand-in", upstream.url + "/echo/base")
    await integrations.set_endpoints(
        ctx,
        project_id=project.id,
        provider="stand-in",
        endpoints=[Endpoint(method="GET", path="models/*")],
        actor="t",
    )
    answer = await exchange(
        gateway_url,
        head(f"/proxy/stand-in/{endpoint}", f"Authorization: Bearer {project.token}", "Connection: close"),
    )
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:40]
    assert upstream.received == []
    # The classic forms (`..`, `%2e%2e`, `%2F`, `%5C`, `//`) are tests/e2e/test_proxy_errors.py::test_400_for_…


@pytest.mark.parametrize(
    "endpoint", ["http://evil.test/x", "//evil.test/x", "@evil.test/x", "https:evil.test", "%5C%5Cevil.test"]
)
async def test_bi05_no_endpoint_can_choose_the_upstream_host(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, endpoint: str
) -> None:
    await add_custom(ctx, project, "stand-in", upstream.url + "/echo/base")
    async with httpx.AsyncClient() as client:
        response = await client.get(
            f"{gateway_url}/proxy/stand-in/{endpoint}",
            headers={"Authorization": f"Bearer {project.token}", "X-Forwarded-Host": "evil.test"},
        )
    # Either refused, or sent to the configured upstream, under its base path, with the endpoint as a path.
    assert response.status_code == 400 or upstream.last.path_qs.startswith("/echo/base/")
    assert all("evil.test" not in (received.header("host") or "") for received in upstream.received)
    assert all(received.header("x-forwarded-host") is None for received in upstream.received)


async def test_bi05_a_base_url_in_the_body_is_forwarded_but_never_routes(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_custom(ctx, project, "stand-in", upstream.url + "/echo/base")
    body = b'{"api_base": "http://evil.test", "base_url": "http://evil.test", "model": "m"}'
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{gateway_url}/proxy/stand-in/chat",
            content=body,
            headers={"Authorization": f"Bearer {project.token}", "Host": "evil.test"},
        )
    assert response.status_code == 200
    assert upstream.last.path_qs == "/echo/base/chat"
    assert upstream.last.body == body
    assert upstream.last.header("host") == upstream.url.removeprefix("http://")


@pytest.mark.parametrize(("provider", "status"), [("OpenAI", 400), ("open%D0%B0i", 400), ("openai%2F..", 400)])
async def test_bi06_a_provider_name_is_matched_exactly_never_folded(
    gateway_url: str, project: Project, upstream: Upstream, provider: str, status: int
) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.get(
            f"{gateway_url}/proxy/{provider}/models", headers={"Authorization": f"Bearer {project.token}"}
        )
    assert response.status_code == status
    assert upstream.received == []


BOMBS = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a": 1, "a": 2}',
    b'{"model": ',
    b"\xff\xfe\x00not utf-8",
    b'"' + b"s" * (5 * 1024 * 1024 - 2) + b'"',
]


@pytest.mark.parametrize("body", BOMBS, ids=["nested", "duplicate-keys", "invalid", "not-utf8", "5MiB-string"])
async def test_bi07_any_body_is_relayed_byte_exact_and_never_parsed_into_an_error(
    settings: Settings, ctx: Context, project: Project, upstream: Upstream, body: bytes
) -> None:
    await add_custom(ctx, project, "stand-in", upstream.url)
    roomy = settings.model_copy(update={"max_request_bytes": 8 * 1024 * 1024})
    async with serving(create_app(roomy, context=ctx), roomy) as url, httpx.AsyncClient() as client:
        response = await client.post(
            f"{url}/proxy/stand-in/echo/x", content=body, headers={"Authorization": f"Bearer {project.token}"}
        )
    assert response.status_code == 200
    assert hashlib.sha256(upstream.last.body).digest() == hashlib.sha256(body).digest()


async def test_bi08_connection_and_hop_by_hop_abuse_never_strips_the_credential(
    gateway_url: str, project: Project, upstream: Upstream
) -> None:
    raw = [
        ("Connection", "keep-alive, Authorization, x-api-key, X-Custom"),
        ("connection", "AUTHORIZATION"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("Trailer", "X-T"),
        ("Upgrade", "h2c"),
        ("Proxy-Authorization", "Basic YTpi"),
        ("Proxy-Connection", "keep-alive"),
        ("X-Forwarded-For", "10.0.0.1"),
        ("X-Forwarded-Host", "evil.test"),
        ("X-Forwarded-Proto", "http"),
        ("Forwarded", "for=10.0.0.1"),
        ("x_api_key", "attacker"),
        ("X_Forwarded_For", "10.0.0.2"),
        ("X-Custom", "named in Connection"),
        ("Authorization", f"Bearer {project.token}"),
    ]
    lines = [f"{name}: {value}" for name, value in raw]
    body = b'{"model": "gpt-4o-mini", "messages": []}'
    request = head(
        "/proxy/openai/chat/completions",
        *lines,
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        method="POST",
    )
    answer = await exchange(gateway_url, request + body, read_for=2)
    assert answer.startswith(b"HTTP/1.1 200 ")
    received = upstream.last
    names = received.header_names()
    for dropped in (
        "keep-alive", "te", "trailer", "upgrade", "proxy-authorization", "proxy-connection", "x-forwarded-for",
        "x-forwarded-host", "x-forwarded-proto", "forwarded", "x_api_key", "x_forwarded_for", "x-custom",
    ):  # fmt: skip
        assert dropped not in names, dropped
    assert [value for name, value in received.headers if name.lower() == "authorization"] == [f"Bearer {project.key}"]
    assert "attacker" not in repr(received.headers)


async def test_bi09_client_credentials_never_pass_through_and_the_key_is_placed_once(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_custom(
        ctx, project, "gemini-like", upstream.url, auth=QueryAuth(method="query", name="key")
    )  # the key in the query, where a client might try its own
    async with httpx.AsyncClient() as client:
        response = await client.get(
            f"{gateway_url}/proxy/gemini-like/echo/models?key=attacker&alt=json",
            headers={
                "x-goog-api-key": project.token,
                "x-api-key": "attacker",
                "api-key": "attacker",
                "Authorization": "Bearer attacker",
                "Cookie": "s=1",
            },
        )
    assert response.status_code == 200
    received = upstream.last
    assert "attacker" not in received.path_qs + repr(received.headers)
    assert received.path_qs.count("key=") == 1
    assert received.header("cookie") is None
    assert project.token not in received.path_qs + repr(received.headers)


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "PROPFIND", "MOVE", "LOCK", "MKCOL"])
async def test_bi11_methods_never_forwarded_get_405_with_allow_before_the_token(
    gateway_url: str, upstream: Upstream, method: str
) -> None:
    answer = await exchange(gateway_url, head("/proxy/openai/models", "Connection: close", method=method))
    assert answer.startswith(b"HTTP/1.1 405 ")
    assert b"\r\nallow: GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS\r\n" in answer
    assert b"x-credgate-error: true" in answer
    assert upstream.received == []


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS"])
async def test_bi11_head_and_options_are_forwarded_only_where_an_endpoint_allows_them(
    gateway_url: str, project: Project, upstream: Upstream, method: str
) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.request(
            method, f"{gateway_url}/proxy/openai/chat/completions", headers={"Authorization": f"Bearer {project.token}"}
        )
    assert response.status_code == 403  # the chat template allows POST only
    assert upstream.received == []


# BI-12: the plan's properties over generated requests are tests/proxy/test_plan_properties.py (Hypothesis); the
# admin API under generated requests is tests/admin_api/test_schemathesis.py.


async def test_bi10_end_to_end_response_headers_arrive_as_sent_and_hop_by_hop_ones_do_not(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    head_lines = [
        "HTTP/1.1 201 Created",
        "Content-Type: application/json",
        "x-request-id: req_upstream",
        "openai-processing-ms: 12",
        "retry-after: 3",
        "set-cookie: a=1; Path=/",
        "set-cookie: b=2; Path=/",
        "x-ratelimit-remaining-requests: 59",
        "Connection: keep-alive, X-Hop",
        "X-Hop: per-connection",
        "Keep-Alive: timeout=5",
        "Proxy-Authenticate: Basic",
        "Content-Length: 2",
    ]
    response_head = ("\r\n".join(head_lines) + "\r\n\r\n").encode()
    async with run_raw_upstream([response_head, b"{}"]) as raw:
        await add_custom(ctx, project, "raw", raw.url)
        async with httpx.AsyncClient() as client:
            response = await client.get(
                f"{gateway_url}/proxy/raw/x", headers={"Authorization": f"Bearer {project.token}"}
            )
    assert response.status_code == 201
    assert response.content == b"{}"
    assert response.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2; Path=/"]
    for name, value in [
        ("x-request-id", "req_upstream"),
        ("openai-processing-ms", "12"),
        ("retry-after", "3"),
        ("x-ratelimit-remaining-requests", "59"),
    ]:
        assert response.headers.get_list(name) == [value]
    for hop in ("x-hop", "keep-alive", "proxy-authenticate"):
        assert hop not in response.headers
    added = set(response.headers) - {line.split(":")[0].lower() for line in head_lines[1:]}
    assert added <= {"x-credgate-request-id", "connection", "date", "server"}  # only what is documented
    assert "server" not in response.headers  # credgate adds no Server header of its own
