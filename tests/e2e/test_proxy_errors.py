"""Every service error of the contract's table (section 4): status, envelope, header, and check order."""

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from credgate.config import Settings
from credgate.services import integrations, projects
from credgate.services.context import Context, utcnow
from credgate.services.integrations import IntegrationChanges
from credgate.services.projects import ProjectChanges
from tests.e2e.conftest import Project, add_custom, add_project, bearer, free_port
from tests.upstream import QUOTA_ERROR, Upstream

LIMIT = 1024  # bytes: this module's request body limit
UNAUTHORIZED = "invalid project token or expired authentication"
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def settings(database: tuple[str, dict[str, Any]], tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data", database_url=database[0], max_request_bytes=LIMIT, allow_private_upstreams=True
    )


@pytest.fixture
async def http(gateway_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
        yield client


def assert_service_error(response: httpx.Response, status: int, message: str | None = None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers.get_list("x-credgate-error") == ["true"]
    assert response.headers["x-request-id"]
    body = response.json()
    assert body == {"error": {"status": status, "message": body["error"]["message"]}}
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    if message is not None:
        assert body["error"]["message"] == message


def assert_upstream_response(response: httpx.Response, status: int) -> None:
    assert response.status_code == status
    assert "x-credgate-error" not in response.headers
    assert response.headers["x-request-id"]


async def raw_get(gateway_url: str, target: str, token: str) -> tuple[int, bytes]:
    """A GET sent byte for byte as written (httpx would remove dot segments); the status and the raw response."""
    host, port = gateway_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    request = f"GET {target} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    writer.write(request.encode())
    response = await reader.read()
    writer.close()
    await writer.wait_closed()
    return int(response.split(b" ", 2)[1]), response


# 401


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer not-a-token"},
        {"Authorization": "Basic Y2dwXzE6Mg=="},
        {"Authorization": "Bearer cgp_"},
        {"Authorization": "Bearer cgp_" + "x" * 43},
        {"x-api-key": "cgp_" + "y" * 43},
    ],
)
async def test_401_for_a_missing_malformed_or_unknown_token_whatever_the_target(
    http: httpx.AsyncClient, project: Project, headers: dict[str, str]
) -> None:
    for path in (
        "openai/chat/completions",
        "BAD.NAME/x",
        "nothere/x",
        "openai/",
        "openai/%2e%2e/x",
        "openai/embeddings",
    ):
        assert_service_error(await http.post(f"/proxy/{path}", json=CHAT, headers=headers), 401, UNAUTHORIZED)


async def test_401_for_an_expired_token(
    http: httpx.AsyncClient, ctx: Context, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, token = await projects.rotate_project_token(ctx, project_id=project.id, actor="t", expires_in_seconds=60)
    assert (await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(token))).status_code == 200
    monkeypatch.setattr(ctx, "clock", lambda: utcnow() + timedelta(seconds=61))
    response = await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(token))
    assert_service_error(response, 401, UNAUTHORIZED)


async def test_401_once_the_grace_period_of_a_rotated_token_ends(
    http: httpx.AsyncClient, ctx: Context, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    await projects.rotate_project_token(ctx, project_id=project.id, actor="t", grace_seconds=30)
    assert (await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(project.token))).is_success
    monkeypatch.setattr(ctx, "clock", lambda: utcnow() + timedelta(seconds=31))
    response = await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(project.token))
    assert_service_error(response, 401, UNAUTHORIZED)


async def test_401_for_a_revoked_token(http: httpx.AsyncClient, ctx: Context, project: Project) -> None:
    await projects.revoke_project_tokens(ctx, project_id=project.id, actor="t")
    for path in ("openai/chat/completions", "BAD.NAME/x", "nothere/x"):
        response = await http.post(f"/proxy/{path}", json=CHAT, headers=bearer(project.token))
        assert_service_error(response, 401, UNAUTHORIZED)


async def test_401_for_the_token_of_a_deleted_project(http: httpx.AsyncClient, ctx: Context, project: Project) -> None:
    await projects.delete_project(ctx, project_id=project.id, actor="t")
    response = await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(project.token))
    assert_service_error(response, 401, UNAUTHORIZED)


async def test_401_is_the_same_whatever_the_reason(http: httpx.AsyncClient, project: Project) -> None:
    """A caller without a valid token learns nothing: same status, headers and body in every case."""
    paths = ["/proxy/openai/chat/completions", "/proxy/nothere/x", "/proxy/BAD/x", "/proxy/openai/embeddings"]
    responses = [await http.post(path, json=CHAT, headers=bearer("cgp_" + "z" * 43)) for path in paths]
    responses.append(await http.post(paths[0], json=CHAT))
    assert len({response.content for response in responses}) == 1
    assert len({tuple(sorted(response.headers.keys())) for response in responses}) == 1
    assert {response.headers["www-authenticate"] for response in responses} == {'Bearer realm="credgate"'}


# 400


@pytest.mark.parametrize("path", ["/proxy/OpenAI/chat/completions", "/proxy/open.ai/x", "/proxy/-x/y", "/proxy//x"])
async def test_400_for_a_malformed_provider_name(http: httpx.AsyncClient, project: Project, path: str) -> None:
    assert_service_error(await http.post(path, json=CHAT, headers=bearer(project.token)), 400)


@pytest.mark.parametrize("path", ["/proxy/openai/", "/proxy/openai", "/proxy/nothere/"])
async def test_400_for_an_empty_endpoint(http: httpx.AsyncClient, project: Project, path: str) -> None:
    assert_service_error(await http.post(path, json=CHAT, headers=bearer(project.token)), 400)


@pytest.mark.parametrize(
    "path",
    [
        "/proxy/openai/%2e%2e/admin",
        "/proxy/openai/chat/%2E%2E/%2E%2E/x",
        "/proxy/openai/chat%2Fcompletions",
        "/proxy/openai/chat%5Ccompletions",
        "/proxy/openai/chat//completions",
        "/proxy/openai/http://evil.test/x",
        "/proxy/nothere/%2e%2e/x",
    ],
)
async def test_400_for_an_endpoint_that_could_leave_the_base_path(
    http: httpx.AsyncClient, project: Project, upstream: Upstream, path: str
) -> None:
    assert_service_error(await http.get(path, headers=bearer(project.token)), 400)
    assert upstream.received == []


@pytest.mark.parametrize("target", ["/proxy/openai/../../admin", "/proxy/openai/chat/./../x", "/proxy/openai/.."])
async def test_400_for_raw_dot_segments(gateway_url: str, project: Project, upstream: Upstream, target: str) -> None:
    status, response = await raw_get(gateway_url, target, project.token)
    assert status == 400
    assert b"\r\nx-credgate-error: true\r\n" in response.lower()
    assert upstream.received == []


# 404


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
async def test_404_for_a_provider_the_project_has_not_set_up(
    http: httpx.AsyncClient, project: Project, method: str
) -> None:
    response = await http.request(method, "/proxy/anthropic/v1/messages", headers=bearer(project.token))
    assert_service_error(response, 404)


async def test_404_for_another_projects_provider(
    http: httpx.AsyncClient, ctx: Context, upstream: Upstream, project: Project
) -> None:
    await add_custom(ctx, project, "private", upstream.url)
    _other, token = await projects.create_project(ctx, name="other", actor="t")
    assert_service_error(await http.get("/proxy/private/echo/x", headers=bearer(token)), 404)


# 403


async def test_403_for_a_disabled_integration(http: httpx.AsyncClient, ctx: Context, project: Project) -> None:
    changes = IntegrationChanges(enabled=False)
    await integrations.update_integration(ctx, project_id=project.id, provider="openai", changes=changes, actor="t")
    response = await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(project.token))
    assert_service_error(response, 403)


async def test_403_for_a_revoked_provider_key(http: httpx.AsyncClient, ctx: Context, project: Project) -> None:
    await integrations.revoke_provider_key(ctx, project_id=project.id, provider="openai", actor="t")
    response = await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(project.token))
    assert_service_error(response, 403)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "embeddings"),
        ("GET", "chat/completions"),
        ("DELETE", "chat/completions"),
        ("POST", "chat/completions/x"),
        ("POST", "chat"),
        ("POST", "images/edits"),
    ],
)
async def test_403_for_an_endpoint_or_method_not_enabled(
    http: httpx.AsyncClient, project: Project, upstream: Upstream, method: str, path: str
) -> None:
    response = await http.request(method, f"/proxy/openai/{path}", json=CHAT, headers=bearer(project.token))
    assert_service_error(response, 403)
    assert upstream.received == []


async def test_403_before_413(http: httpx.AsyncClient, project: Project) -> None:
    response = await http.post("/proxy/openai/embeddings", content=b"x" * (LIMIT + 1), headers=bearer(project.token))
    assert_service_error(response, 403)


# 413


async def test_413_by_content_length(http: httpx.AsyncClient, project: Project, upstream: Upstream) -> None:
    response = await http.post(
        "/proxy/openai/chat/completions", content=b"x" * (LIMIT + 1), headers=bearer(project.token)
    )
    assert_service_error(response, 413)
    assert upstream.received == []


async def chunks(total: int, size: int = 256) -> AsyncIterator[bytes]:
    for start in range(0, total, size):
        yield b"x" * min(size, total - start)


async def test_413_for_a_chunked_body_over_the_limit(
    http: httpx.AsyncClient, project: Project, upstream: Upstream
) -> None:
    response = await http.post(
        "/proxy/openai/chat/completions", content=chunks(LIMIT * 2), headers=bearer(project.token)
    )
    assert_service_error(response, 413)
    await asyncio.sleep(0.1)
    assert upstream.received == []  # never a truncated body that looks complete


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_at_the_limit_passes(
    http: httpx.AsyncClient, ctx: Context, upstream: Upstream, project: Project, chunked: bool
) -> None:
    await add_custom(ctx, project, "echo", upstream.url)
    content = chunks(LIMIT) if chunked else b"x" * LIMIT
    response = await http.post("/proxy/echo/echo/x", content=content, headers=bearer(project.token))
    assert_upstream_response(response, 200)
    assert response.json()["body_length"] == LIMIT


# 429


async def test_429_with_retry_after_when_the_project_rate_limit_is_exceeded(
    http: httpx.AsyncClient, ctx: Context, project: Project, upstream: Upstream
) -> None:
    changes = ProjectChanges(rate_limit_per_minute=2)
    await projects.update_project(ctx, project_id=project.id, changes=changes, actor="t")
    statuses = [
        (await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(project.token))).status_code
        for _ in range(2)
    ]
    assert statuses == [200, 200]
    response = await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(project.token))
    assert_service_error(response, 429)
    assert response.headers["retry-after"] == "30"  # a token every 30 s at 2 per minute
    assert len(upstream.received) == 2


async def test_413_before_429(http: httpx.AsyncClient, ctx: Context, project: Project) -> None:
    changes = ProjectChanges(rate_limit_per_minute=1)
    await projects.update_project(ctx, project_id=project.id, changes=changes, actor="t")
    await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(project.token))
    response = await http.post(
        "/proxy/openai/chat/completions", content=b"x" * (LIMIT + 1), headers=bearer(project.token)
    )
    assert_service_error(response, 413)


async def test_rate_limit_is_per_project(
    http: httpx.AsyncClient, ctx: Context, upstream: Upstream, project: Project
) -> None:
    other = await add_project(ctx, upstream)
    changes = ProjectChanges(rate_limit_per_minute=1)
    await projects.update_project(ctx, project_id=project.id, changes=changes, actor="t")
    for token, expected in ((project.token, 200), (project.token, 429), (other.token, 200), (other.token, 200)):
        response = await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(token))
        assert response.status_code == expected


# 502 and 504


async def test_502_for_a_closed_port(http: httpx.AsyncClient, ctx: Context, project: Project) -> None:
    await add_custom(ctx, project, "down", f"http://127.0.0.1:{free_port()}")
    assert_service_error(await http.get("/proxy/down/v1/models", headers=bearer(project.token)), 502)


async def test_502_when_the_upstream_hangs_up_before_answering(
    http: httpx.AsyncClient, ctx: Context, project: Project
) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    async with server:
        await add_custom(ctx, project, "rude", f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        assert_service_error(await http.get("/proxy/rude/v1/models", headers=bearer(project.token)), 502)


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "POST"])
async def test_no_retry_once_the_request_was_sent(
    http: httpx.AsyncClient, ctx: Context, project: Project, method: str
) -> None:
    """A request the upstream received is never sent again (issue 3: no retry once any byte went upstream)."""
    received: list[bytes] = []  # request lines only: the headers hold the provider key

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append((await reader.readuntil(b"\r\n\r\n")).split(b"\r\n", 1)[0])
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    async with server:
        await add_custom(ctx, project, "once", f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        response = await http.request(method, "/proxy/once/v1/files/f1", content=b"{}", headers=bearer(project.token))
        assert_service_error(response, 502)
    assert received == [f"{method} /v1/files/f1 HTTP/1.1".encode()]


async def test_502_when_the_upstream_does_not_speak_http(
    http: httpx.AsyncClient, ctx: Context, project: Project
) -> None:
    async def babble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(babble, "127.0.0.1", 0)
    async with server:
        await add_custom(ctx, project, "babble", f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        assert_service_error(await http.get("/proxy/babble/v1/models", headers=bearer(project.token)), 502)


async def test_504_when_the_upstream_does_not_answer_in_time(
    http: httpx.AsyncClient, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_custom(ctx, project, "slow", upstream.url, timeout_seconds=0.3)
    started = time.monotonic()
    response = await http.get("/proxy/slow/slow", params={"seconds": "3"}, headers=bearer(project.token))
    assert_service_error(response, 504)
    assert time.monotonic() - started < 1.5


async def test_an_answer_within_the_timeout_passes(
    http: httpx.AsyncClient, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_custom(ctx, project, "slow", upstream.url, timeout_seconds=1.0)
    response = await http.get("/proxy/slow/slow", params={"seconds": "0.2"}, headers=bearer(project.token))
    assert_upstream_response(response, 200)


# upstream errors are not ours


async def test_upstream_errors_are_relayed_unwrapped(
    http: httpx.AsyncClient, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_custom(ctx, project, "stand-in", upstream.url)
    quota = await http.post("/proxy/stand-in/quota/x", json=CHAT, headers=bearer(project.token))
    assert_upstream_response(quota, 429)
    assert quota.json() == QUOTA_ERROR
    async with httpx.AsyncClient() as client:
        direct = await client.get(f"{upstream.url}/no/such/route")
    missing = await http.get("/proxy/stand-in/no/such/route", headers=bearer(project.token))
    assert_upstream_response(missing, 404)
    assert missing.content == direct.content


async def test_every_response_has_its_own_request_id(http: httpx.AsyncClient, project: Project) -> None:
    responses = [
        await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(project.token)),
        await http.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer(project.token)),
        await http.post("/proxy/openai/chat/completions", json=CHAT),
        await http.post("/proxy/nothere/x", json=CHAT, headers=bearer(project.token)),
        await http.get("/proxy/openai/chat/completions", headers=bearer(project.token)),
    ]
    ids = [response.headers.get_list("x-credgate-request-id") for response in responses]
    assert all(len(values) == 1 and len(values[0]) >= 8 for values in ids)
    assert len({values[0] for values in ids}) == len(responses)
    # X-Request-Id: the upstream's own, relayed unchanged (once), else ours.
    assert [response.headers.get_list("x-request-id") for response in responses] == [
        ["req_upstream"],
        ["req_upstream"],
        ids[2],
        ids[3],
        ids[4],
    ]
