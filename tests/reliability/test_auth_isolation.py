"""Catalogue group AU: authentication and isolation, of project tokens at the proxy and of the admin plane.

Where the catalogue's choice differs from credgate's documented behaviour, the documented one is asserted:
tokens are `cgp_…` (not `pgw_…`), and invalid input to the admin API is 422 (not 400).
"""

import asyncio
import base64
import functools
import hashlib
import re
import secrets
import sqlite3
import ssl
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import httpx
import pytest
from argon2 import PasswordHasher
from sqlalchemy import event, text

from credgate.admin_api.routes import router as admin_api_router
from credgate.admin_ui import integration_pages, project_pages
from credgate.crypto import hash_token
from credgate.services import admins, integrations, panel_sessions, projects
from credgate.services.context import Context, utcnow
from credgate.services.integrations import IntegrationChanges
from credgate.specs import AuthSpec, Endpoint
from tests.admin_ui.test_security import PASSWORD, admin, csrf_of, sign_in  # noqa: F401  (admin: a fixture)
from tests.e2e.conftest import Project, RunningGateway, add_project, bearer
from tests.e2e.test_proxy_errors import UNAUTHORIZED, assert_service_error
from tests.reliability.test_bad_input import exchange, head
from tests.reliability.test_faults import (  # noqa: F401  (backend, relayed: fixtures)
    POSTGRES_BEHIND_A_RELAY,
    Relayed,
    backend,
    relayed,
)
from tests.secret_sweep import SWEEP, exposed
from tests.upstream import Upstream, run_raw_upstream

CHAT = b'{"model": "gpt-4o-mini", "messages": []}'
CHAT_PATH = "/proxy/openai/chat/completions"
ON_BOTH_BACKENDS = pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every test client (they speak plain HTTP): httpx would load the CA bundle anew for
    each client, a tenth of a second every time."""
    return ssl.create_default_context()


def gateway_client(base_url: str, **options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, verify=tls_context(), **options)


@pytest.fixture(autouse=True)
def _quick_password_hashing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """These tests are about sessions and their defences, not password hashing: argon2 at its production cost
    (64 MiB, three passes) for every admin created and every sign-in would take a third of their time."""
    quick = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    monkeypatch.setattr(admins, "_password_hasher", quick)
    monkeypatch.setattr(panel_sessions, "_password_hasher", quick)
    panel_sessions._dummy_hash.cache_clear()
    yield
    panel_sessions._dummy_hash.cache_clear()  # elsewhere, an unknown user costs what a real password does


def canary() -> str:
    """A provider key no test shares, registered with the sweep."""
    key = f"canary-{uuid.uuid4()}"
    SWEEP.register(key)
    return key


async def connect(
    ctx: Context,
    project_id: str,
    provider: str,
    base_url: str,
    *,
    key: str | None = None,
    auth: AuthSpec | None = None,
    **changes: Any,
) -> str:
    """A custom integration allowing every method and path, with this key (a new canary if none) and these
    settings; returns the key."""
    key = key or canary()
    SWEEP.register(key)
    await integrations.add_custom_integration(
        ctx, project_id=project_id, provider=provider, base_url=base_url, api_key=key, auth=auth, actor="tests"
    )
    everything = [Endpoint(method="*", path="**")]
    await integrations.set_endpoints(ctx, project_id=project_id, provider=provider, endpoints=everything, actor="t")
    if changes:
        await integrations.update_integration(
            ctx, project_id=project_id, provider=provider, changes=IntegrationChanges(**changes), actor="t"
        )
    return key


def near_miss(token: str) -> str:
    """The token with one character of its random part changed."""
    index = len(token) // 2
    return token[:index] + ("A" if token[index] != "A" else "B") + token[index + 1 :]


async def first_answer(gateway_url: str, request: bytes, *, within: float) -> bytes:
    """Send `request` and return the gateway's first answer (head and envelope), which must come `within` s."""
    host, port = gateway_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"}}"), within)
    finally:
        writer.close()


# AU-01…AU-04: the token check


async def test_au01_a_request_without_a_credential_gets_401_with_a_bearer_challenge_and_reaches_nothing(
    gateway_url: str, project: Project, upstream: Upstream
) -> None:
    missing: list[dict[str, str]] = [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Token"},
        {"x-api-key": ""},
    ]
    async with gateway_client(gateway_url) as http:
        for headers in missing:
            response = await http.post(CHAT_PATH, content=CHAT, headers=headers)
            assert_service_error(response, 401, UNAUTHORIZED)
            assert response.headers["www-authenticate"].startswith("Bearer ")
    assert upstream.received == []


async def test_au02_malformed_credentials_get_401_or_400_never_a_5xx_and_the_gateway_keeps_serving(
    gateway_url: str, project: Project, upstream: Upstream
) -> None:
    token = project.token
    malformed = [
        [f"Authorization: Basic {base64.b64encode(f'{token}:'.encode()).decode()}"],
        [f"Authorization: Basic {token}"],
        [f"Authorization: Bearer {token[:20]} {token[20:]}"],
        [f"Authorization: Bearer {token}x"],
        [f'Authorization: Bearer "{token}"'],
        ["Authorization: Bearer cgp_" + "a" * 10_240],
        ["Authorization: Bearer not-a-token", "Authorization: Bearer cgp_unknown"],
    ]
    for lines in malformed:
        answer = await exchange(gateway_url, head("/proxy/openai/models", *lines, "Connection: close"))
        assert answer.startswith(b"HTTP/1.1 401 "), (lines[0][:40], answer[:40])
    # Bytes outside ASCII, and a CR inside the token, as a hostile client sends them.
    non_ascii = head("/proxy/openai/models", "Connection: close").replace(
        b"Host: gateway\r\n", b"Host: gateway\r\nAuthorization: Bearer cgp_\xe9\xff\xfe\r\n"
    )
    assert (await exchange(gateway_url, non_ascii, read_for=2)).startswith(b"HTTP/1.1 401 ")
    carriage_return = f"GET /proxy/openai/models HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {token}\rx\r\n\r\n"
    assert (await exchange(gateway_url, carriage_return.encode(), read_for=2)).startswith(b"HTTP/1.1 400 ")
    async with gateway_client(gateway_url) as http:
        assert (await http.get("/healthz")).status_code == 200
    assert upstream.received == []


async def test_au02_every_documented_credential_header_and_scheme_spelling_is_accepted_alike(
    gateway_url: str, project: Project, upstream: Upstream
) -> None:
    token = project.token
    accepted = [
        ("Authorization", f"Bearer {token}"),
        ("Authorization", f"bearer {token}"),  # RFC 6750: the scheme is case-insensitive
        ("Authorization", f"BEARER {token}"),
        ("Authorization", f"Token {token}"),
        ("x-api-key", token),
        ("api-key", token),
        ("x-goog-api-key", token),
        ("xi-api-key", token),
    ]
    async with gateway_client(gateway_url) as http:
        for name, value in accepted:
            response = await http.post(CHAT_PATH, content=CHAT, headers={name: value})
            assert response.status_code == 200, (name, value[:12])
    assert len(upstream.received) == len(accepted)
    for received in upstream.received:
        assert [value for name, value in received.headers if name.lower() == "authorization"] == [
            f"Bearer {project.key}"
        ]


SQL_TOKENS = [
    "' OR '1'='1",
    "%",
    "*",
    '"; --',
    "cgp_' OR 1=1--",
    "cgp_%",
    "cgp_*",
    "cgp_\\",
    "cgp_' UNION SELECT token_hash FROM project_tokens--",
    "cgp_%' OR token_hash LIKE '%",
]


@ON_BOTH_BACKENDS
async def test_au03_sql_in_a_token_gets_401_and_reaches_the_database_only_as_a_bound_hash(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    executed: list[tuple[str, str]] = []  # (statement, its parameters)

    def record(_conn: object, _cursor: object, statement: str, parameters: object, *_: object) -> None:
        executed.append((statement, repr(parameters)))

    engine = ctx.database.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        async with gateway_client(gateway_url) as http:
            for token in SQL_TOKENS:
                response = await http.post(CHAT_PATH, content=CHAT, headers=bearer(token))
                assert_service_error(response, 401, UNAUTHORIZED)
                assert not re.search(r"select|syntax|sqlite|postgres|token_hash", response.text, re.IGNORECASE)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert upstream.received == []
    lookups = [(statement, parameters) for statement, parameters in executed if "token_hash = " in statement]
    looked_up = [token for token in SQL_TOKENS if token.startswith("cgp_")]  # the others are refused unread
    assert len(lookups) == len(looked_up)
    for token, (statement, parameters) in zip(looked_up, lookups, strict=True):
        assert hash_token(token) in parameters
        assert token[4:] not in statement
        assert token[4:] not in parameters


async def test_au04_unknown_expired_revoked_and_deleted_tokens_get_one_401_that_reveals_nothing(
    gateway_url: str, ctx: Context, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    expiring = await add_project(ctx, upstream)
    _, expired = await projects.rotate_project_token(ctx, project_id=expiring.id, actor="t", expires_in_seconds=60)
    revoked = await add_project(ctx, upstream)
    await projects.revoke_project_tokens(ctx, project_id=revoked.id, actor="t")
    deleted = await add_project(ctx, upstream)
    await projects.delete_project(ctx, project_id=deleted.id, actor="t")
    monkeypatch.setattr(ctx, "clock", lambda: utcnow() + timedelta(seconds=61))
    tokens = ["cgp_" + secrets.token_urlsafe(32), expired, revoked.token, deleted.token]

    answers = []
    async with gateway_client(gateway_url) as http:
        for token in tokens:
            response = await http.post(CHAT_PATH, content=CHAT, headers=bearer(token))
            assert_service_error(response, 401, UNAUTHORIZED)
            headers = sorted((name, value) for name, value in response.headers.items() if "request-id" not in name)
            answers.append((headers, response.content))
            seen = repr(response.headers.items()) + response.text
            # Nothing of the token beyond the 8 characters the API shows, nor its hash, nor the schema.
            assert not any(token[start : start + 9] in seen for start in range(len(token) - 8))
            assert hash_token(token)[:16] not in seen
            assert not re.search(r"project_tokens|token_hash|provider_keys|select |traceback", seen, re.IGNORECASE)
    assert all(answer == answers[0] for answer in answers)
    assert upstream.received == []


# AU-05…AU-07: isolation between projects


async def test_au05_cross_project_matrix_reaches_only_its_own_upstream(
    gateway_url: str, ctx: Context, upstream: Upstream
) -> None:
    """5 projects × 4 providers, each provider set up in some projects only: every (token, provider) pair."""
    providers = ("alpha", "beta", "gamma", "delta")
    tokens: list[str] = []
    keys: dict[tuple[int, str], str] = {}
    for index in range(5):
        project, token = await projects.create_project(ctx, name=f"p{index}", actor="t")
        tokens.append(token)
        for offset, provider in enumerate(providers):
            if (index + offset) % 3:
                keys[index, provider] = await connect(
                    ctx, project.id, provider, f"{upstream.url}/echo/p{index}/{provider}"
                )

    async with gateway_client(gateway_url) as http:
        for index, token in enumerate(tokens):
            for provider in providers:
                before = len(upstream.received)
                response = await http.post(f"/proxy/{provider}/matrix", content=CHAT, headers=bearer(token))
                if (index, provider) in keys:
                    assert response.status_code == 200
                    assert len(upstream.received) == before + 1
                    assert upstream.last.path_qs == f"/echo/p{index}/{provider}/matrix"
                    assert upstream.last.header("authorization") == f"Bearer {keys[index, provider]}"
                else:
                    assert_service_error(response, 404)
                    assert len(upstream.received) == before
    for received in upstream.received:  # no request ever carries another pair's key, in any encoding
        _, _, project_part, provider, _ = received.path_qs.split("/")
        others = set(keys.values()) - {keys[int(project_part[1:]), provider]}
        assert exposed(repr(received.headers).encode() + received.body, others) == set()


AU06_REQUESTS = 1000  # the catalogue's 100,000 at 500 at once are a benchmark's job; this runs in seconds
# With the cache cleared every 100 requests, every request in flight may start a lookup: at 64 on a loaded 2-core
# machine some SQLite lookups outlasted the proxy's 2 s bound (503s, never a crossing).
AU06_CONCURRENCY = 32


async def test_au06_same_provider_in_two_projects_under_interleaved_load_never_crosses(
    gateway_url: str, ctx: Context, upstream: Upstream
) -> None:
    """Two projects both call their provider `openai` (different keys and base URLs). Requests with either
    token, or a token one character away from either, are interleaved at random over real sockets, while the
    lookup cache is cleared every 100 requests so that fresh lookups race with requests in flight."""
    sides: dict[str, tuple[str, str]] = {}  # name → (token, key)
    for name in ("a", "b"):
        project, token = await projects.create_project(ctx, name=name, actor="t")
        sides[name] = (token, await connect(ctx, project.id, "openai", f"{upstream.url}/echo/{name}"))
    tokens = {name: token for name, (token, _) in sides.items()} | {
        f"{name}~": near_miss(token) for name, (token, _) in sides.items()
    }
    plan = [("a", "b", "a~", "b~")[index % 4] for index in range(AU06_REQUESTS)]
    secrets.SystemRandom().shuffle(plan)
    statuses = [0] * AU06_REQUESTS
    queue = iter(range(AU06_REQUESTS))

    async def worker(http: aiohttp.ClientSession) -> None:
        for index in queue:
            if index % 100 == 0:
                ctx.access.invalidate()
            url = f"{gateway_url}/proxy/openai/chat?n={index}"
            async with http.post(url, data=CHAT, headers=bearer(tokens[plan[index]])) as response:
                await response.read()
                statuses[index] = response.status

    # aiohttp as the client: lighter than httpx, so the gateway rather than the client is what is loaded
    connector = aiohttp.TCPConnector(limit=AU06_CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(worker(http) for _ in range(AU06_CONCURRENCY)))

    assert [status for index, status in enumerate(statuses) if plan[index].endswith("~")] == [401] * (
        AU06_REQUESTS // 2
    )
    assert [status for index, status in enumerate(statuses) if not plan[index].endswith("~")] == [200] * (
        AU06_REQUESTS // 2
    )
    assert len(upstream.received) == AU06_REQUESTS // 2
    for received in upstream.received:
        path, _, query = received.path_qs.partition("?")
        side = plan[int(query.removeprefix("n="))]
        assert path == f"/echo/{side}/chat"
        assert received.header("authorization") == f"Bearer {sides[side][1]}"


async def test_au07_a_bad_token_is_refused_before_the_body_is_read_and_the_upstream_is_never_contacted(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    async with run_raw_upstream([30.0]) as slow:  # an upstream that would hold the request for 30 s
        await connect(ctx, project.id, "slow", slow.url)
        for credential in (f"Authorization: Bearer cgp_{secrets.token_urlsafe(32)}", "X-No-Credential: 1"):
            request = head(
                "/proxy/slow/upload",
                credential,
                f"Content-Length: {9 * 1024 * 1024}",
                "Content-Type: application/octet-stream",
                method="POST",
            )
            started = time.monotonic()
            answer = await first_answer(gateway_url, request + b"x" * 65536, within=1)  # 64 KiB of 9 MiB sent
            assert answer.startswith(b"HTTP/1.1 401 ")
            assert time.monotonic() - started < 1
        assert slow.connections == 0


# AU-08: the token's shape is checked before any lookup


@POSTGRES_BEHIND_A_RELAY
async def test_au08_with_the_database_down_a_token_without_the_prefix_gets_401_and_a_cgp_token_503(
    relayed: Relayed,  # noqa: F811  (the fixture imported above)
) -> None:
    """credgate's tokens carry no checksum (the catalogue's GitHub-style CRC32), so the prefix is the only
    check made without the database: whatever lacks it is refused with 401 while the database refuses
    connections; a `cgp_` token, valid or not, fails closed with 503 and goes nowhere."""
    relayed.relay.refuse()
    for index in range(120):
        guess = ("", "sk-", "cga_", "CGP_", "cgp-", "pgw_")[index % 6] + secrets.token_urlsafe(32)
        assert_service_error(await relayed.http.post(CHAT_PATH, content=CHAT, headers=bearer(guess)), 401)
    for token in (relayed.cold.token, "cgp_" + secrets.token_urlsafe(32)):  # `cold` is valid, never looked up
        response = await relayed.http.post(CHAT_PATH, content=CHAT, headers=bearer(token))
        request_id = response.headers["x-credgate-request-id"]
        assert_service_error(response, 503, f"storage unavailable (request id {request_id})")
    assert len(relayed.upstream.received) == 1  # the warm-up request of the fixture, nothing since
    relayed.relay.restore()
    assert (await relayed.chat(relayed.cold)).status_code == 200


# AU-09: token generation


async def test_au09_tokens_issued_through_the_admin_api_are_unique_256_bit_and_shown_once(
    client: httpx.AsyncClient,
) -> None:
    created = (await client.post("/api/v1/projects", json={"name": "tokens"})).json()
    project_id = created["project"]["id"]
    issued = [created["secret"]]
    for _ in range(30):
        rotated = await client.post(f"/api/v1/projects/{project_id}/token/rotate", json={"grace_seconds": 0})
        issued.append(rotated.json()["secret"])

    assert len(set(issued)) == len(issued)
    # 32 random bytes in base64url after the documented `cgp_` (the catalogue's `pgw_` and checksum are not
    # credgate's format).
    assert all(re.fullmatch(r"cgp_[A-Za-z0-9_-]{43}", token) for token in issued)
    first_owner: dict[str, str] = {}
    for token in issued:  # no 9-character run of one token's random part recurs in another
        for start in range(4, len(token) - 8):
            assert first_owner.setdefault(token[start : start + 9], token) == token
    reads = [
        f"/api/v1/projects/{project_id}",
        "/api/v1/projects",
        "/api/v1/audit",
        f"/api/v1/projects/{project_id}/requests",
    ]
    shown = " ".join([(await client.get(path)).text for path in reads])
    assert not [token for token in issued if token[4:12] in shown]
    assert (await client.get(f"/api/v1/projects/{project_id}")).json()["token"]["prefix"] == issued[-1][:8]


# AU-10: authorisation of the admin plane


def admin_api_calls(project_id: str, provider: str) -> Iterator[tuple[str, str]]:
    """Every (method, path) of the admin API, its path parameters filled."""
    for route in admin_api_router.routes:
        path = getattr(route, "path", "")
        for method in sorted(getattr(route, "methods", ())):
            yield method, path.replace("{project_id}", project_id).replace("{provider}", provider)


def panel_calls(project_id: str, provider: str, *, methods: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """Every (method, path) of the panel's pages behind sign-in, their path parameters filled."""
    for route in [*project_pages.routes, *integration_pages.routes]:
        for method in sorted(set(getattr(route, "methods", ())) & set(methods)):
            yield method, "/admin" + route.path.replace("{project_id}", project_id).replace("{provider}", provider)


async def state_of(client: httpx.AsyncClient, *project_ids: str) -> list[Any]:
    """Everything an admin can read about these projects, and how many changes were ever audited."""
    state: list[Any] = [(await client.get("/api/v1/audit", params={"limit": 1000})).json()]
    for project_id in project_ids:
        state.append((await client.get(f"/api/v1/projects/{project_id}")).json())
        state.append((await client.get(f"/api/v1/projects/{project_id}/integrations")).json())
    return state


async def test_au10_every_admin_api_route_refuses_a_caller_without_an_admin_token(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream, admin_token: str
) -> None:
    project = await add_project(ctx, upstream)
    before = await state_of(client, project.id)
    refused = [
        {},
        bearer(project.token),
        {"x-api-key": project.token},
        bearer("cga_" + secrets.token_urlsafe(32)),
        bearer(admin_token + "x"),
        {"Authorization": f"Token {admin_token}"},
        {"Authorization": "Basic " + base64.b64encode(f"{admin_token}:".encode()).decode()},
    ]
    calls = list(admin_api_calls(project.id, "openai"))
    assert len(calls) >= 17
    async with httpx.AsyncClient(transport=client._transport, base_url=client.base_url) as anonymous:
        for method, path in calls:
            for headers in refused:
                response = await anonymous.request(method, path, headers=headers, json={"name": "x"})
                assert_service_error(response, 401)
                assert response.headers["www-authenticate"] == "Bearer"
    assert await state_of(client, project.id) == before


async def test_au10_every_panel_page_and_form_needs_a_signed_in_admin(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    project = await add_project(ctx, upstream)
    before = await state_of(client, project.id)
    calls = list(panel_calls(project.id, "openai", methods=("GET", "POST")))
    assert len(calls) >= 25
    async with httpx.AsyncClient(transport=client._transport, base_url=client.base_url) as anonymous:
        for cookies in ({}, {"credgate_session": secrets.token_urlsafe(32)}):
            anonymous.cookies = httpx.Cookies(cookies)
            for method, path in calls:
                response = await anonymous.request(method, path, data={"name": "x", "api_key": canary()})
                assert signed_out(response), path
    assert await state_of(client, project.id) == before


async def test_au10_fields_a_caller_may_not_set_are_refused_by_name_and_never_applied(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    mine, other = await add_project(ctx, upstream), await add_project(ctx, upstream)
    integration = f"/api/v1/projects/{mine.id}/integrations/openai"
    attempts: list[tuple[str, str, dict[str, Any], str]] = [
        ("POST", "/api/v1/projects", {"name": "x", "id": "prj_chosen"}, "id"),
        ("POST", "/api/v1/projects", {"name": "x", "token_hash": "0" * 64}, "token_hash"),
        ("PATCH", f"/api/v1/projects/{mine.id}", {"name": "y", "created_by": "someone"}, "created_by"),
        ("POST", f"/api/v1/projects/{mine.id}/token/rotate", {"token_hash": "0" * 64}, "token_hash"),
        ("PATCH", integration, {"project_id": other.id}, "project_id"),
        ("PATCH", integration, {"key_ciphertext": "AAAA"}, "key_ciphertext"),
        ("PATCH", integration, {"provider": "renamed"}, "provider"),
        ("PUT", f"{integration}/key", {"api_key": canary(), "project_id": other.id}, "project_id"),
        (
            "POST",
            f"/api/v1/projects/{mine.id}/integrations",
            {"provider": "x", "base_url": "https://api.example.com", "api_key": canary(), "project_id": other.id},
            "project_id",
        ),
    ]
    before = await state_of(client, mine.id, other.id)
    for method, path, body, field in attempts:
        response = await client.request(method, path, json=body)
        assert_service_error(response, 422)
        assert field in response.json()["error"]["message"]
    assert await state_of(client, mine.id, other.id) == before


async def test_au10_a_projects_path_never_reaches_another_projects_integration(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    owner, other = await add_project(ctx, upstream), await add_project(ctx, upstream, provider="elsewhere")
    before = await state_of(client, owner.id, other.id)
    through_other = f"/api/v1/projects/{other.id}/integrations/openai"  # `openai` is the owner's only
    attempts: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", through_other, None),
        ("PATCH", through_other, {"enabled": False}),
        ("PUT", f"{through_other}/key", {"api_key": canary()}),
        ("DELETE", f"{through_other}/key", None),
        ("PUT", f"{through_other}/endpoints", {"endpoints": []}),
        ("DELETE", through_other, None),
    ]
    for method, path, body in attempts:
        assert_service_error(await client.request(method, path, json=body), 404)
    assert await state_of(client, owner.id, other.id) == before


async def test_au10_an_admin_of_one_project_neither_reads_nor_changes_another(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    """The catalogue's admin scoped to project A calling project B: 403 for every admin API route that names B,
    nothing of either changed, while the same token reads and changes A (tests/admin_api/test_roles.py walks every
    route for every role)."""
    mine, other = await add_project(ctx, upstream), await add_project(ctx, upstream)
    token = await admins.create_admin_token(
        ctx, name="admin-of-a", actor="tests", role="project_admin", project_ids=[mine.id]
    )
    calls = [(method, path) for method, path in admin_api_calls(other.id, "openai") if other.id in path]
    assert len(calls) >= 30
    before = await state_of(client, mine.id, other.id)
    async with httpx.AsyncClient(transport=client._transport, base_url=client.base_url, headers=bearer(token)) as a:
        for method, path in calls:
            body = {"name": "x", "api_key": canary(), "enabled": False, "endpoints": []}
            response = await a.request(method, path, json=body)
            assert_service_error(response, 403)
        assert await state_of(client, mine.id, other.id) == before
        own = f"/api/v1/projects/{mine.id}/integrations/openai"
        assert (await a.get(own)).json()["provider"] == "openai"
        assert (await a.patch(own, json={"enabled": False})).status_code == 200
    assert (await client.get(own)).json()["enabled"] is False
    assert (await client.get(f"/api/v1/projects/{other.id}/integrations/openai")).json()["enabled"] is True


async def test_au10_an_admin_token_is_not_a_project_token(
    gateway_url: str, admin_token: str, project: Project, upstream: Upstream
) -> None:
    async with gateway_client(gateway_url) as http:
        for headers in (bearer(admin_token), {"x-api-key": admin_token}):
            assert_service_error(await http.post(CHAT_PATH, content=CHAT, headers=headers), 401, UNAUTHORIZED)
    assert upstream.received == []


# AU-11…AU-15: the panel's sessions, forms and headers


def cookie_attributes(set_cookie: str) -> tuple[str, str, dict[str, str]]:
    """A Set-Cookie header as (name, value, {attribute in lowercase: value})."""
    pair, *attributes = (part.strip() for part in set_cookie.split(";"))
    name, _, value = pair.partition("=")
    parsed = {key.lower(): val for key, _, val in (attribute.partition("=") for attribute in attributes)}
    return name, value, parsed


def session_cookie(signed_in: httpx.Response) -> tuple[str, str, dict[str, str]]:
    """The session cookie a sign-in sets (beside it, the sign-in form's CSRF cookie is deleted)."""
    cookies = [cookie_attributes(header) for header in signed_in.headers.get_list("set-cookie")]
    (session,) = [cookie for cookie in cookies if cookie[0].endswith("credgate_session")]
    return session


@pytest.mark.usefixtures("admin")
async def test_au11_the_session_cookie_is_host_bound_secure_httponly_strict_and_only_its_hash_is_stored(
    client: httpx.AsyncClient, ctx: Context
) -> None:
    client.base_url = httpx.URL("https://credgate.test")
    name, value, attributes = session_cookie(await sign_in(client))
    assert name == "__Host-credgate_session"
    assert {"secure", "httponly", "path", "samesite"} <= set(attributes)
    assert "domain" not in attributes
    assert (attributes["path"], attributes["samesite"].lower()) == ("/", "strict")
    assert re.fullmatch(r"[A-Za-z0-9_-]{43,}", value)  # at least 256 random bits
    async with ctx.database.engine.connect() as connection:
        rows = (await connection.execute(text("SELECT * FROM admin_sessions"))).all()
    assert [row.id for row in rows] == [hashlib.sha256(value.encode()).hexdigest()]
    assert not any(value in repr(row) for row in rows)


@pytest.mark.usefixtures("admin")
async def test_au11_over_plain_http_the_cookie_cannot_be_host_bound_but_stays_httponly_and_strict(
    client: httpx.AsyncClient,
) -> None:
    """Browsers refuse `__Host-` and `Secure` cookies without HTTPS; the README says the panel gets both there."""
    form = await client.get("/admin/login")
    _, _, login_csrf = cookie_attributes(form.headers["set-cookie"])
    name, _, attributes = session_cookie(await sign_in(client))
    assert name == "credgate_session"
    for cookie in (attributes, login_csrf):
        assert "httponly" in cookie
        assert cookie["samesite"].lower() == "strict"
        assert "domain" not in cookie


def signed_out(response: httpx.Response) -> bool:
    return (response.status_code, response.headers.get("location")) == (303, "/admin/login")


async def session_rows(ctx: Context) -> int:
    async with ctx.database.engine.connect() as connection:
        return int((await connection.execute(text("SELECT count(*) FROM admin_sessions"))).scalar_one())


@pytest.mark.usefixtures("admin")
async def test_au12_each_sign_in_is_a_new_session_and_signing_out_ends_that_one_on_every_page(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    project = await add_project(ctx, upstream)
    pages = [path for _, path in panel_calls(project.id, "openai", methods=("GET",))]
    planted = "planted-before-sign-in"
    async with (
        httpx.AsyncClient(transport=client._transport, base_url=client.base_url) as second,
        httpx.AsyncClient(transport=client._transport, base_url=client.base_url) as stale,
    ):
        client.cookies.set("credgate_session", planted)
        _, first_session, _ = session_cookie(await sign_in(client))
        _, second_session, _ = session_cookie(await sign_in(second))
        assert len({planted, first_session, second_session}) == 3
        client.cookies = httpx.Cookies({"credgate_session": first_session})
        csrf = csrf_of((await client.get("/admin/projects")).text)
        assert (await client.post("/admin/logout", data={"csrf": csrf})).status_code == 303

        for cookie in (first_session, planted):
            stale.cookies = httpx.Cookies({"credgate_session": cookie})
            for path in pages:
                assert signed_out(await stale.get(path)), path
        for path in pages:  # the other session is untouched
            assert not signed_out(await second.get(path)), path
    assert await session_rows(ctx) == 1


@pytest.mark.usefixtures("admin")
async def test_au12_idle_and_absolute_timeouts_end_the_session_on_every_page_and_delete_it(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = await add_project(ctx, upstream)
    pages = [path for _, path in panel_calls(project.id, "openai", methods=("GET",))]
    start = utcnow()
    await sign_in(client)
    monkeypatch.setattr(ctx, "clock", lambda: start + timedelta(minutes=31))  # idle for 31 minutes
    for path in pages:
        assert signed_out(await client.get(path)), path
    assert await session_rows(ctx) == 0

    monkeypatch.setattr(ctx, "clock", lambda: start)
    await sign_in(client)
    for minutes in range(29, 12 * 60, 29):  # busy, never idle, for twelve hours
        monkeypatch.setattr(ctx, "clock", lambda minutes=minutes: start + timedelta(minutes=minutes))
        assert (await client.get("/admin/projects")).status_code == 200
    monkeypatch.setattr(ctx, "clock", lambda: start + timedelta(hours=12, minutes=1))
    for path in pages:
        assert signed_out(await client.get(path)), path
    assert await session_rows(ctx) == 0


def asks_confirmation(response: httpx.Response, back_to: str) -> bool:
    location = f"/admin/confirm?next={quote(back_to, safe='')}"
    return (response.status_code, response.headers.get("location")) == (303, location)


@pytest.mark.usefixtures("admin")
async def test_au12_handing_out_or_taking_away_a_credential_needs_a_sign_in_within_15_minutes(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = await add_project(ctx, upstream)
    start = utcnow()
    monkeypatch.setattr(ctx, "clock", lambda: start)
    await sign_in(client)
    csrf = csrf_of((await client.get("/admin/projects")).text)
    page = f"/admin/projects/{project.id}/integrations/openai/key"
    rotation = {"api_key": canary(), "csrf": csrf}
    from_page = {"Referer": f"http://credgate.test{page}"}
    monkeypatch.setattr(ctx, "clock", lambda: start + timedelta(minutes=16))  # still signed in: 30 minutes idle
    before = await key_state(ctx, project.id), await state_of(client, project.id)
    integration, of_project = f"/admin/projects/{project.id}/integrations/openai", f"/admin/projects/{project.id}"
    timeouts = {"timeout_seconds": "600", "stream_idle_timeout_seconds": "300", "total_timeout_seconds": "3600"}
    elsewhere = {"csrf": csrf, "base_url": "https://elsewhere.example.com/v1", **timeouts}
    other_provider = {"jwks_url": "https://idp.example.com/jwks.json", "issuer": "https://idp.example.com"}
    end_users = {"csrf": csrf, "allowed_origins": "", "subject_rate_limit_per_minute": "", "audience": "x"}
    sensitive = [
        ("POST", page, rotation),
        ("POST", f"{integration}/revoke", {"csrf": csrf}),
        ("POST", f"{integration}/delete", {"csrf": csrf}),
        ("POST", integration, elsewhere),  # where the key goes
        ("POST", f"{integration}/keys", {"csrf": csrf, "api_key": canary(), "label": "second"}),
        ("POST", f"{integration}/keys/key_x", {"csrf": csrf, "action": "promote", "overlap": "0"}),
        ("POST", f"{integration}/keys/key_x/remove", {"csrf": csrf}),
        ("POST", f"{of_project}/custom", {"csrf": csrf}),
        ("POST", f"{of_project}/add", {"csrf": csrf}),
        ("POST", f"{of_project}/token/rotate", {"csrf": csrf, "grace_seconds": "0"}),
        ("POST", f"{of_project}/token/revoke", {"csrf": csrf}),
        ("POST", f"{of_project}/delete", {"csrf": csrf}),
        ("POST", f"{of_project}/webhooks", {"csrf": csrf, "url": "https://hooks.example.com/x"}),
        ("POST", f"{of_project}/webhooks/whk_x/remove", {"csrf": csrf}),
        ("POST", f"{of_project}/end-users", end_users | other_provider),  # whose end-user tokens are taken
        ("POST", "/admin/projects", {"csrf": csrf, "name": "another"}),
        ("POST", "/admin/admins/tokens", {"csrf": csrf, "name": "ci", "role": "owner"}),
        ("POST", "/admin/admins/tokens/adm_x/role", {"csrf": csrf, "role": "viewer"}),
        ("POST", "/admin/admins/tokens/adm_x/revoke", {"csrf": csrf}),
        ("POST", "/admin/admins/users", {"csrf": csrf, "username": "eve", "password": PASSWORD, "role": "owner"}),
        ("POST", "/admin/admins/users/usr_x/role", {"csrf": csrf, "role": "viewer"}),
        ("POST", "/admin/admins/users/usr_x/delete", {"csrf": csrf}),
    ]
    for method, path, data in sensitive:
        response = await client.request(method, path, data=data, headers=from_page)
        assert asks_confirmation(response, page), (method, path)
    # A form's own page comes back to itself; a post without a Referer from the panel, to the projects list.
    revoke_page = f"/admin/projects/{project.id}/integrations/openai/revoke"
    assert asks_confirmation(await client.get(revoke_page, headers=from_page), revoke_page)
    assert asks_confirmation(await client.get(page), page)
    assert asks_confirmation(await client.post(page, data=rotation), "/admin/projects")
    assert (await key_state(ctx, project.id), await state_of(client, project.id)) == before
    assert len(await admins.list_admin_users(ctx)) == 1
    # A change that hands out nothing is made as before.
    integration_now = await integrations.get_integration(ctx, project_id=project.id, provider="openai")
    unchanged = [
        (of_project, {"csrf": csrf, "name": "renamed"}),
        (integration, {"csrf": csrf, "base_url": integration_now.base_url, **timeouts}),  # same URL: other settings
        (f"{of_project}/end-users", end_users | {"audience": ""}),  # origins and limits, no identity provider
    ]
    for path, data in unchanged:
        response = await client.post(path, data=data)
        assert response.status_code == 303, (path, response.text[:500])
        assert response.headers["location"].startswith(of_project), path

    confirm = await client.get("/admin/confirm", params={"next": page})
    assert 'name="password"' in confirm.text
    assert f'name="next" value="{page}"' in confirm.text
    wrong = await client.post("/admin/confirm", data={"csrf": csrf, "next": page, "password": "not it"})
    assert (wrong.status_code, "Wrong password." in wrong.text) == (401, True)
    assert asks_confirmation(await client.post(page, data=rotation, headers=from_page), page)
    forged = await client.post("/admin/confirm", data={"next": page, "password": PASSWORD})
    assert forged.status_code == 403  # the form's CSRF token is needed here too
    confirmed = await client.post("/admin/confirm", data={"csrf": csrf, "next": page, "password": PASSWORD})
    assert (confirmed.status_code, confirmed.headers["location"]) == (303, page)
    assert "Confirmed." in (await client.get(page)).text
    assert (await client.post(page, data=rotation, headers=from_page)).status_code == 303
    assert await key_state(ctx, project.id) != before[0]
    actions = [event["action"] for event in (await client.get("/api/v1/audit")).json()["items"]]
    assert "panel.confirm" in actions

    # Fifteen minutes after the confirmation, it is needed again; the session itself is still alive.
    monkeypatch.setattr(ctx, "clock", lambda: start + timedelta(minutes=32))
    assert asks_confirmation(await client.post(page, data=rotation, headers=from_page), page)
    assert (await client.get(page.removesuffix("/key"))).status_code == 200


@pytest.mark.usefixtures("admin")
async def test_au12_a_confirmation_only_ever_sends_back_to_a_panel_page(client: httpx.AsyncClient) -> None:
    await sign_in(client)
    csrf = csrf_of((await client.get("/admin/projects")).text)
    away = ["https://evil.test/admin/x", "//evil.test/admin/", "/\\evil.test/admin/", "/api/v1/projects", ""]
    away += ["/admin/..//evil.test", "/admin//evil.test", "/admin/./x", "/admin/\r\nSet-Cookie: x"]
    for elsewhere in away:
        shown = await client.get("/admin/confirm", params={"next": elsewhere})
        assert 'name="next" value="/admin/projects"' in shown.text, elsewhere
        sent = await client.post("/admin/confirm", data={"csrf": csrf, "next": elsewhere, "password": PASSWORD})
        assert (sent.status_code, sent.headers["location"]) == (303, "/admin/projects"), elsewhere
    off_site = {"Referer": "https://evil.test/admin/projects/x"}
    response = await client.post("/admin/projects", data={"csrf": csrf, "name": "x"}, headers=off_site)
    assert response.status_code == 303  # signed in just now: made at once, nothing to confirm


async def key_state(ctx: Context, project_id: str) -> tuple[Any, ...]:
    integration = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert integration.key is not None
    return integration.key.ciphertext, integration.key.updated_at


@pytest.mark.usefixtures("admin")
async def test_au13_cross_site_key_rotation_is_refused_every_way_and_changes_nothing(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    project = await add_project(ctx, upstream)
    await sign_in(client)
    csrf = csrf_of((await client.get("/admin/projects")).text)
    target = f"/admin/projects/{project.id}/integrations/openai/key"
    new_key = canary()
    before = await key_state(ctx, project.id), await state_of(client, project.id)
    forged: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({"data": {"api_key": new_key, "csrf": csrf}}, {"Origin": "https://evil.test"}),
        ({"data": {"api_key": new_key, "csrf": csrf}}, {"Origin": "null"}),
        ({"data": {"api_key": new_key}}, {}),  # a cross-site form cannot know the token
        ({"content": f"api_key={new_key}&csrf=", "headers": {"Content-Type": "text/plain"}}, {}),
        ({"data": {"api_key": new_key, "csrf": "guessed"}}, {"Sec-Fetch-Site": "cross-site"}),
    ]
    for request, headers in forged:
        request.setdefault("headers", {}).update(headers)
        assert (await client.post(target, **request)).status_code == 403, headers
    assert (await key_state(ctx, project.id), await state_of(client, project.id)) == before
    # The panel's own form does rotate the key: the refusals above were the defence, not a broken form.
    assert (await client.post(target, data={"api_key": new_key, "csrf": csrf})).status_code == 303
    assert await key_state(ctx, project.id) != before[0]


@pytest.mark.usefixtures("admin")
async def test_au13_get_head_and_options_never_change_state_anywhere_in_the_admin_plane(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    project = await add_project(ctx, upstream)
    await sign_in(client)
    csrf = csrf_of((await client.get("/admin/projects")).text)
    # A form's fields as a query string (a key-like value, not a registered one: the test client logs its URLs).
    form = {"csrf": csrf, "name": "renamed", "api_key": f"sk-{uuid.uuid4()}", "grace_seconds": "0", "enabled": "0"}
    paths = {path for _, path in panel_calls(project.id, "openai", methods=("GET", "POST"))}
    paths |= {path for _, path in admin_api_calls(project.id, "openai")} | {"/admin/logout"}
    before = await state_of(client, project.id), await key_state(ctx, project.id)
    for path in sorted(paths):
        for method in ("GET", "HEAD", "OPTIONS"):
            response = await client.request(method, path, params=form)
            assert response.status_code < 500, (method, path)
    assert (await state_of(client, project.id), await key_state(ctx, project.id)) == before
    assert (await client.get("/admin/projects")).status_code == 200  # still signed in: nothing logged out


def csp_directives(policy: str) -> dict[str, str]:
    return {name: value.strip() for name, _, value in (part.strip().partition(" ") for part in policy.split(";"))}


@pytest.mark.usefixtures("admin")
async def test_au14_every_panel_response_carries_the_security_headers_and_no_cors_grant(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    project = await add_project(ctx, upstream)
    await sign_in(client)
    pages = [path for _, path in panel_calls(project.id, "openai", methods=("GET",))]
    pages += ["/admin/", "/admin/login", "/admin/setup", "/admin/nowhere", "/admin/static/panel.css"]
    responses = [await client.get(path, headers={"Origin": "https://evil.test"}) for path in pages]
    responses.append(await client.post(f"/admin/projects/{project.id}", data={"csrf": "forged"}))  # an error page
    for response in responses:
        headers = response.headers
        policy = csp_directives(headers["content-security-policy"])
        assert (policy["object-src"], policy["base-uri"], policy["frame-ancestors"]) == ("'none'",) * 3
        assert "unsafe-inline" not in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] in ("no-referrer", "same-origin")
        assert "access-control-allow-origin" not in headers, response.url
    for method in ("GET", "OPTIONS"):
        response = await client.request(
            method,
            "/api/v1/projects",
            headers={"Origin": "https://evil.test", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in response.headers
        assert "access-control-allow-credentials" not in response.headers


async def test_au14_over_https_the_panel_pins_https_for_a_year_and_over_plain_http_it_does_not(
    client: httpx.AsyncClient,
) -> None:
    """HTTPS as a TLS-terminating front proxy reports it (X-Forwarded-Proto from a trusted address)."""
    for path in ("/admin/login", "/admin/static/panel.css", "/admin/nowhere"):
        secure = await client.get(path, headers={"X-Forwarded-Proto": "https"})
        assert secure.headers["strict-transport-security"] == "max-age=31536000", path
        plain = await client.get(path)
        assert "strict-transport-security" not in plain.headers, path


async def failed_sign_in(client: httpx.AsyncClient, username: str) -> httpx.Response:
    form = await client.get("/admin/login")
    data = {"csrf": csrf_of(form.text), "username": username, "password": "not the password"}
    return await client.post("/admin/login", data=data)


@pytest.mark.usefixtures("admin")
async def test_au15_an_unknown_user_is_answered_like_a_wrong_password_and_failures_are_throttled_per_address(
    client: httpx.AsyncClient,
) -> None:
    def page(response: httpx.Response) -> str:  # without the two values that differ by design
        return re.sub(r'name="(csrf|username)" value="[^"]*"', "", response.text)

    unknown, known = await failed_sign_in(client, "nobody-here"), await failed_sign_in(client, "admin")
    assert unknown.status_code == known.status_code == 401
    assert page(unknown) == page(known)
    for index in range(4):  # six failures from this address, each username failing once
        assert (await failed_sign_in(client, f"guess-{index}")).status_code == 401
    assert (await failed_sign_in(client, "one-more")).status_code == 429
    assert (await sign_in(client)).status_code == 429  # the address waits, even with the right password


@pytest.mark.usefixtures("admin")
async def test_au15_a_sign_in_is_audited_and_a_refused_token_is_logged_without_the_token(
    gateway_url: str, client: httpx.AsyncClient, project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    await sign_in(client)
    events = (await client.get("/api/v1/audit")).json()["items"]
    assert (events[0]["action"], events[0]["actor"]) == ("panel.sign_in", "user:admin")
    wrong = near_miss(project.token)
    async with gateway_client(gateway_url) as http:
        await http.post(CHAT_PATH, content=CHAT, headers=bearer(wrong))
    lines = [record.getMessage() for record in caplog.records if record.name == "credgate.access"]
    assert [line for line in lines if line.startswith(f"POST {CHAT_PATH} 401 ")]
    assert not [record for record in caplog.records if wrong[8:] in record.getMessage()]


# AU-16: a fresh install


def test_au16_a_fresh_install_has_no_admin_no_docs_and_only_a_one_time_setup_link(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    found = re.search(r"(http://127\.0\.0\.1:\d+)/admin/setup\?token=([A-Za-z0-9_-]+)", gateway.log.read_text())
    assert found is not None  # the panel's address, on loopback by default, and the link
    setup_token = found.group(2)
    database = tmp_path / "data" / "credgate.db"
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT count(*) FROM admin_users").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM admin_tokens").fetchone() == (0,)
        assert db.execute("SELECT value FROM meta WHERE name = 'setup_token_hash'").fetchone() == (
            hash_token(setup_token),
        )
    assert setup_token.encode() not in database.read_bytes()

    with httpx.Client(base_url=gateway.url, verify=tls_context()) as http:
        for path in ("/docs", "/redoc", "/openapi.json", "/api/v1/docs", "/api/v1/redoc", "/admin/docs"):
            assert http.get(path).status_code == 404, path
        assert http.get("/api/v1/projects").status_code == 401
        assert http.get("/admin/projects").headers["location"] == "/admin/login"
        assert http.get("/admin/setup").status_code == 404
        assert http.get("/admin/setup", params={"token": secrets.token_urlsafe(32)}).status_code == 404
        form = {"token": setup_token, "username": "first", "password": PASSWORD, "password_again": PASSWORD}
        assert http.post("/admin/setup", data=form).status_code == 303
        assert http.post("/admin/setup", data=form | {"username": "second"}).status_code == 404  # used once
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT username FROM admin_users").fetchall() == [("first",)]
        assert db.execute("SELECT count(*) FROM meta WHERE name = 'setup_token_hash'").fetchone() == (0,)
