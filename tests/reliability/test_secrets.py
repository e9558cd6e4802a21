"""Catalogue group SE: secret handling. A provider key reaches its own upstream and nothing else; a project
token never leaves the gateway; the database holds neither without the master key.

Keys are canaries (`canary-<uuid4>`) registered with the suite's sweep, which also finds them base64, hex,
percent- or JSON-encoded. Where the catalogue's choice differs from credgate's documented behaviour, the
documented one is asserted: invalid input is 422 (not 400), a key's surrounding spaces are trimmed (not
refused).
"""

import asyncio
import datetime
import ipaddress
import os
import re
import shutil
import sqlite3
import ssl
import sysconfig
import tomllib
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from cryptography import x509
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import NameOID
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from sqlalchemy import inspect, text

import credgate.proxy.relay
import credgate.services.projects
from credgate.config import Settings
from credgate.crypto import (
    DecryptionError,
    KeyRing,
    encode_master_key,
    hash_token,
    master_key_id,
    new_master_key,
    secret_binding,
)
from credgate.errors import StartupError
from credgate.masterkey import read_key_file
from credgate.services import admins, integrations, panel_sessions, projects
from credgate.services.bootstrap import open_context
from credgate.services.context import Context
from credgate.services.provider_keys import API_KEY_PURPOSE
from credgate.specs import AuthSpec, BasicAuth, HeaderAuth, QueryAuth
from tests.admin_ui.test_security import PASSWORD, admin, csrf_of, sign_in  # noqa: F401  (admin: a fixture)
from tests.e2e.conftest import CREDGATE, Project, add_project, bearer, free_port, start_gateway, stop_gateway
from tests.e2e.test_proxy_errors import assert_service_error
from tests.reliability.test_auth_isolation import (  # noqa: F401  (_quick_password_hashing: an autouse fixture)
    CHAT,
    CHAT_PATH,
    ON_BOTH_BACKENDS,
    _quick_password_hashing,
    canary,
    connect,
    gateway_client,
    panel_calls,
    state_of,
)
from tests.reliability.test_faults import (  # noqa: F401  (backend, relayed: fixtures)
    POSTGRES_BEHIND_A_RELAY,
    Relayed,
    backend,
    relayed,
)
from tests.secret_sweep import SWEEP, exposed
from tests.upstream import Received, Upstream, run_raw_upstream

INTERNALS = re.compile(r"traceback|exception|error\(|aiohttp|sqlalchemy|select |\bfile \"|https?://", re.IGNORECASE)


def seen(response: httpx.Response) -> str:
    """What a client gets: status line, headers and body."""
    headers = "\n".join(f"{name}: {value}" for name, value in response.headers.items())
    return f"{response.status_code}\n{headers}\n\n{response.text}"


def wire_of(received: Received) -> bytes:
    """What an upstream got: request line, headers and body."""
    headers = "\n".join(f"{name}: {value}" for name, value in received.headers)
    return f"{received.method} {received.path_qs}\n{headers}\n\n".encode() + received.body


# Not the gateway's: the tests' own HTTP client, and uvicorn's access log, which `credgate serve` turns off
# (pytest's log capture turns it back on when the gateway runs in the test's process).
NOT_THE_GATEWAYS_LOGS = ("httpx", "httpcore", "uvicorn.access")


def log_text(caplog: pytest.LogCaptureFixture) -> str:
    """Every log record the gateway wrote during the test, with its exception."""
    return "\n".join(
        record.getMessage() + (repr(record.exc_info[1]) if record.exc_info else "")
        for record in caplog.records
        if not record.name.startswith(NOT_THE_GATEWAYS_LOGS)
    )


async def database_dump(ctx: Context) -> bytes:
    """What a copy of the database gives away: every row of every table, and for SQLite its files as they
    are on disk, write-ahead log included."""
    async with ctx.database.engine.connect() as connection:
        tables = await connection.run_sync(lambda sync: inspect(sync).get_table_names())
        values = []
        for table in tables:
            for row in await connection.execute(text(f'SELECT * FROM "{table}"')):  # noqa: S608  (our own names)
                values += [value if isinstance(value, bytes) else str(value).encode() for value in row]
    files = [] if ctx.database.file is None else [Path(f"{ctx.database.file}{suffix}") for suffix in ("", "-wal")]
    return b"\n".join(values) + contents(files)


def contents(paths: Iterable[Path]) -> bytes:
    """The bytes of these files (of every file under those that are folders), those that exist."""
    files = [found for path in paths for found in ([path] if not path.is_dir() else path.rglob("*"))]
    return b"\n".join(path.read_bytes() for path in files if path.is_file())


async def sealed_keys(ctx: Context) -> list[tuple[str, str, bytes, str]]:
    """(project id, provider, ciphertext, master key id) of every stored provider key."""
    query = text(
        "SELECT i.project_id, i.provider, k.ciphertext, k.master_key_id "
        "FROM provider_keys k JOIN integrations i ON i.id = k.integration_id"
    )
    async with ctx.database.engine.connect() as connection:
        return [(row[0], row[1], bytes(row[2]), row[3]) for row in await connection.execute(query)]


# SE-01, SE-02: where keys and tokens go


async def test_se01_canary_keys_reach_only_their_own_upstream_and_no_other_sink_in_any_encoding(
    ctx: Context,
    settings: Settings,
    database: tuple[str, dict[str, Any]],
    admin_token: str,
    upstream: Upstream,
    tmp_path: Path,
) -> None:
    """A real `credgate serve` at DEBUG: every auth placement, successes and each kind of error, admin reads
    and rejected writes. Each key may then be found only in what its own integration's upstream received, and
    the project tokens nowhere at all: not in responses, the log, the database or the data dir."""
    (first, first_token), (second, second_token) = [
        await projects.create_project(ctx, name=name, actor="t") for name in ("first", "second")
    ]
    keys: dict[str, str] = {}  # "<project>-<provider>" → its key, which the upstream sees next to `via=…`
    placements: dict[str, AuthSpec | None] = {
        "bearer": None,
        "header": HeaderAuth(method="header", name="x-api-key"),
        "query": QueryAuth(method="query", name="key"),
        "basic": BasicAuth(method="basic"),
    }
    for name, auth in placements.items():
        keys[f"first-{name}"] = f"user:{canary()}" if name == "basic" else canary()
        await connect(ctx, first.id, name, f"{upstream.url}/v1", key=keys[f"first-{name}"], auth=auth)
    SWEEP.register(keys["first-basic"].removeprefix("user:"))
    keys["second-bearer"] = await connect(ctx, second.id, "bearer", f"{upstream.url}/v1")  # the same name
    keys["first-quota"] = await connect(ctx, first.id, "quota", f"{upstream.url}/quota")  # the provider's 429
    keys["first-gone"] = await connect(ctx, first.id, "gone", f"http://127.0.0.1:{free_port()}")

    responses: list[httpx.Response] = []
    process, running = start_gateway(
        settings.data_dir, tmp_path / "gateway.log", {"CREDGATE_DATABASE_URL": database[0]}
    )
    try:
        async with gateway_client(running.url, timeout=10) as http:
            for token, side in ((first_token, "first"), (second_token, "second")):
                for name in ("bearer", "header", "query", "basic", "quota", "gone", "nothere"):
                    path = f"/proxy/{name}/chat/completions?via={side}-{name}"
                    responses.append(await http.post(path, content=CHAT, headers=bearer(token)))
                responses.append(await http.post(CHAT_PATH, content=CHAT, headers=bearer(token + "x")))
                quoting = f"/proxy/bearer/chat/completions?via={side}-bearer&api_key={token}"
                responses.append(await http.post(quoting, content=CHAT, headers={"x-api-key": token}))
            keys["first-rotated"] = canary()
            api = f"/api/v1/projects/{first.id}/integrations"
            duplicate = {"provider": "bearer", "base_url": f"{upstream.url}/v1", "api_key": keys["first-bearer"]}
            calls: list[tuple[str, str, dict[str, Any] | None]] = [
                ("PUT", f"{api}/bearer/key", {"api_key": keys["first-rotated"]}),
                ("PUT", f"{api}/header/key", {"api_key": f"{keys['first-header']}\r\nX-Injected: 1"}),  # 422
                ("POST", api, duplicate),  # 409
                ("PATCH", f"{api}/query", {"enabled": False}),
                ("GET", api, None),
                ("GET", f"{api}/basic", None),
                ("GET", f"/api/v1/projects/{first.id}/requests", None),
                ("GET", f"/api/v1/projects/{first.id}/usage?group_by=provider", None),
                ("GET", "/api/v1/audit", None),
            ]
            for method, path, body in calls:
                responses.append(await http.request(method, path, json=body, headers=bearer(admin_token)))
            for path in ("bearer/chat/completions?via=first-rotated", "query/chat/completions"):  # 200, 403
                responses.append(await http.post(f"/proxy/{path}", content=CHAT, headers=bearer(first_token)))
    finally:
        stop_gateway(process, running)

    assert [response.status_code for response in responses[:9]] == [200, 200, 200, 200, 429, 502, 404, 401, 200]
    assert [response.status_code for response in responses[-2:]] == [200, 403]
    sinks = [seen(response).encode() for response in responses]
    sinks.append(contents([tmp_path]))  # the gateway's log, the database, the data dir
    tokens = [first_token, second_token]
    assert exposed(b"\n".join(sinks), [*keys.values(), *tokens]) == set()
    for received in upstream.received:
        via = received.path_qs.partition("via=")[2].partition("&")[0]
        assert exposed(wire_of(received), [*keys.values(), *tokens]) == {keys[via]}, received.path_qs
    assert len(upstream.received) == 9


async def test_se02_the_project_token_never_leaves_the_gateway_wherever_the_client_puts_it(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, admin_token: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    key = await connect(ctx, project.id, "stand-in", upstream.url)
    token = project.token
    placements = [
        {"Authorization": f"Bearer {token}"},
        {"Authorization": f"Token {token}"},
        {"x-api-key": token},
        {"api-key": token},
        {"x-goog-api-key": token},
        {"xi-api-key": token},
        {"x_api_key": token},
    ]
    copies = {"X-Echo": token, "X-Forwarded-Authorization": f"Bearer {token}", "Cookie": f"t={token}"}
    async with gateway_client(gateway_url) as http:
        for headers in placements:
            path = f"/proxy/stand-in/echo/x?api_key={token}&t=%20{token}"
            response = await http.post(path, content=b"{}", headers=headers | copies)
            assert response.status_code == 200, headers
            assert token not in response.text
        admin_headers = {"Authorization": f"Bearer {admin_token}"}
        reads = [f"/api/v1/projects/{project.id}", f"/api/v1/projects/{project.id}/requests", "/api/v1/audit"]
        shown = [(await http.get(path, headers=admin_headers)).text for path in reads]
    assert len(upstream.received) == len(placements)
    for received in upstream.received:
        assert exposed(wire_of(received), [token]) == set()
        assert received.header("authorization") == f"Bearer {key}"
    assert exposed("\n".join(shown), [token]) == set()
    assert token[:8] in shown[0]  # the prefix is what identifies a token
    assert exposed(log_text(caplog), [token]) == set()


# SE-03, SE-04: errors


async def test_se03_a_key_placed_in_the_query_stays_out_of_errors_logs_and_records(
    gateway_url: str, ctx: Context, upstream: Upstream, admin_token: str, caplog: pytest.LogCaptureFixture
) -> None:
    project, token = await projects.create_project(ctx, name="query", actor="t")
    key = canary()
    in_query = QueryAuth(method="query", name="key")
    redirect = f"HTTP/1.1 302 Found\r\nLocation: https://elsewhere.test/cb?key={key}&x=1\r\nContent-Length: 0\r\n\r\n"
    async with run_raw_upstream([redirect.encode()]) as redirecting:
        cases = [
            ("quota", f"{upstream.url}/quota", {}, "x", 429),  # the provider's own error
            ("missing", upstream.url, {}, "nothing/here", 404),
            ("refused", f"http://127.0.0.1:{free_port()}", {}, "x", 502),
            ("tls", f"https://{upstream.url.removeprefix('http://')}", {}, "x", 502),
            ("slow", upstream.url, {"timeout_seconds": 0.3}, "slow?seconds=1", 504),
            ("redirect", redirecting.url, {}, "x", 302),
        ]
        responses = []
        async with gateway_client(gateway_url) as http:
            for provider, base_url, config, endpoint, status in cases:
                await connect(ctx, project.id, provider, base_url, key=key, auth=in_query, **config)
                response = await http.get(f"/proxy/{provider}/{endpoint}", headers=bearer(token))
                assert response.status_code == status, provider
                responses.append(seen(response))
            admin_headers = {"Authorization": f"Bearer {admin_token}"}
            for path in (f"/api/v1/projects/{project.id}/requests", f"/api/v1/projects/{project.id}/integrations"):
                responses.append((await http.get(path, headers=admin_headers)).text)
    assert "REDACTED" in responses[-3]  # the redirect's Location, which quoted the key back
    assert exposed("\n".join(responses), [key]) == set()
    assert exposed(log_text(caplog), [key]) == set()
    access = [record.getMessage() for record in caplog.records if record.name == "credgate.access"]
    assert [line for line in access if line.startswith("GET /proxy/slow/slow 504 ")]  # logged without its query
    assert all("key=" in received.path_qs for received in upstream.received)  # it was placed, and only there


async def test_se04_every_kind_of_upstream_failure_answers_a_generic_envelope_with_a_request_id(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        run_raw_upstream([], reset=True) as resetting,
        run_raw_upstream([b"garbage\r\n\r\n"]) as garbled,
        run_raw_upstream([5.0]) as silent,
    ):
        failures = {
            "dns": "https://no-such-host.invalid",  # a reserved name: no resolver answers it
            "refused": f"http://127.0.0.1:{free_port()}",
            "tls": f"https://{upstream.url.removeprefix('http://')}",  # an upstream that speaks plain HTTP
            "reset": resetting.url,
            "garbled": garbled.url,
            "silent": silent.url,
        }
        async with gateway_client(gateway_url, timeout=10) as http:
            for provider, base_url in failures.items():
                key = await connect(ctx, project.id, provider, base_url, timeout_seconds=0.5)
                response = await http.get(f"/proxy/{provider}/v1/models?q=1", headers=bearer(project.token))
                assert response.status_code in (502, 504), provider
                assert_service_error(response, response.status_code)
                message = response.json()["error"]["message"]
                assert not INTERNALS.search(message), message
                assert base_url.split("//")[1] not in message
                assert response.headers["x-credgate-request-id"] in log_text(caplog), provider  # to correlate
                assert exposed(seen(response) + log_text(caplog), [key, project.token]) == set()


async def test_se04_an_unexpected_error_in_the_proxy_answers_500_in_the_envelope_with_the_request_id(
    gateway_url: str, project: Project, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the proxy (forced here) must still answer the service-error envelope with the request id, never
    what uvicorn answers to an exception that escapes the app: a plain-text `Internal Server Error`."""

    def broken(**_: object) -> None:
        raise RuntimeError("internal detail that must stay in the log")

    monkeypatch.setattr(credgate.proxy.relay, "plan_upstream", broken)
    async with gateway_client(gateway_url) as http:
        response = await http.post(CHAT_PATH, content=CHAT, headers=bearer(project.token))
    request_id = response.headers.get("x-credgate-request-id")
    assert_service_error(response, 500, f"internal error (request id {request_id})")
    assert upstream.received == []


async def test_se04_an_unexpected_error_in_the_admin_api_or_panel_shows_no_internals(
    gateway_url: str, ctx: Context, admin_token: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(*_: object, **__: object) -> None:
        raise RuntimeError("internal detail at /srv/credgate/secret.py")

    await admins.create_admin_user(ctx, username="admin", password=PASSWORD, actor="t")
    session, _ = await panel_sessions.sign_in(ctx, username="admin", password=PASSWORD)
    monkeypatch.setattr(credgate.services.projects, "list_projects", broken)
    async with gateway_client(gateway_url) as http:
        response = await http.get("/api/v1/projects", headers=bearer(admin_token))
        http.cookies.set("credgate_session", session)
        page = await http.get("/admin/projects")
    assert_service_error(response, 500, f"internal error (request id {response.headers['x-credgate-request-id']})")
    assert (page.status_code, bool(page.headers["x-credgate-request-id"])) == (500, True)
    for answer in (response, page):
        assert "internal detail" not in seen(answer)
        assert not re.search(r"traceback|RuntimeError", seen(answer), re.IGNORECASE)
    assert "internal detail" in log_text(caplog)  # the details are in the log, for the operator


@POSTGRES_BEHIND_A_RELAY
async def test_se04_with_the_database_down_each_plane_answers_503_in_the_envelope(
    relayed: Relayed,  # noqa: F811  (the fixture imported above)
) -> None:
    relayed.relay.refuse()
    admin_headers = bearer(relayed.admin_token)
    answers = [
        await relayed.chat(relayed.cold),
        await relayed.http.get("/api/v1/projects", headers=admin_headers),
        await relayed.http.post("/api/v1/projects", json={"name": "lost"}, headers=admin_headers),
        await relayed.http.get("/readyz"),
    ]
    for response in answers:
        assert_service_error(response, 503)
        assert not INTERNALS.search(response.json()["error"]["message"])
        assert "postgres" not in response.text.lower()
    assert len(relayed.upstream.received) == 1  # the fixture's warm-up request only


# SE-05: what the admin plane shows


@pytest.mark.usefixtures("admin")
async def test_se05_the_admin_api_and_every_panel_page_show_a_key_only_as_its_last_four_characters(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    project = (await client.post("/api/v1/projects", json={"name": "shown"})).json()["project"]
    api = f"/api/v1/projects/{project['id']}/integrations"
    first, custom_key, rotated = canary(), canary(), canary()
    body = {"provider": "openai", "template": "openai-chat-completions", "api_key": first}
    assert (await client.post(api, json=body | {"base_url": f"{upstream.url}/v1"})).status_code == 201
    body = {"provider": "own", "base_url": upstream.url, "api_key": custom_key}
    assert (await client.post(api, json=body)).status_code == 201
    assert (await client.put(f"{api}/openai/key", json={"api_key": rotated})).status_code == 200
    reads = [
        await client.get(path) for path in (api, f"{api}/openai", f"{api}/own", f"/api/v1/projects/{project['id']}")
    ]
    await sign_in(client)
    reads += [await client.get(path) for _, path in panel_calls(project["id"], "openai", methods=("GET",))]
    assert exposed("\n".join(seen(response) for response in reads), [first, custom_key, rotated]) == set()
    hints = {item["provider"]: item["key"]["hint"] for item in reads[0].json()["items"]}
    assert hints == {"openai": "…" + rotated[-4:], "own": "…" + custom_key[-4:]}


@pytest.mark.usefixtures("admin")
async def test_se05_invalid_input_names_the_field_and_never_echoes_the_key(
    client: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    project = await add_project(ctx, upstream)
    api = f"/api/v1/projects/{project.id}/integrations"
    key = canary()
    invalid: list[tuple[str, str, bytes | dict[str, Any]]] = [
        ("POST", api, {"api_key": key}),  # no provider: pydantic would hold the whole body as `input`
        ("POST", api, {"provider": "x", "base_url": "https://api.example.com", "api_key": key, "timeout": "x"}),
        ("POST", api, {"provider": "x", "base_url": f"https://{key}@api.example.com", "api_key": key}),
        ("POST", api, {"provider": "x", "base_url": "https://api.example.com", "api_key": [key]}),
        ("POST", api, {"provider": f"{key}!", "base_url": "https://api.example.com", "api_key": "k" * 20}),
        ("PATCH", f"{api}/openai", {"headers": {f"{key}: x": "value"}}),  # a key pasted as a header name
        ("PATCH", f"{api}/openai", {"query": {"key": key}, "timeout_seconds": key}),
        ("PUT", f"{api}/openai/key", {"api_key": key + "\x00"}),
        ("PUT", f"{api}/openai/key", {"api_key": key, "apikey": key}),
        ("PUT", f"{api}/openai/key", b'{"api_key": "' + key.encode() + b'", '),  # malformed JSON
    ]
    for method, path, body in invalid:
        sent = {"content": body} if isinstance(body, bytes) else {"json": body}
        response = await client.request(method, path, **sent)
        assert_service_error(response, 422)
        assert exposed(seen(response), [key]) == set(), body
        assert "input" not in response.json()["error"]
    await sign_in(client)
    csrf = csrf_of((await client.get("/admin/projects")).text)
    forms = [
        (f"/admin/projects/{project.id}/custom", {"provider": "x", "base_url": "not a url", "api_key": key}),
        (f"/admin/projects/{project.id}/integrations/openai/key", {"api_key": f"{key}\x01"}),
    ]
    for path, form in forms:
        response = await client.post(path, data=form | {"csrf": csrf})
        assert response.status_code == 422
        assert exposed(seen(response), [key]) == set(), path


# SE-06…SE-10: what is stored


@ON_BOTH_BACKENDS
async def test_se06_a_database_dump_holds_no_key_or_token_and_its_ciphertexts_open_under_no_other_master_key(
    ctx: Context, upstream: Upstream
) -> None:
    shared, other = canary(), canary()
    created = [await add_project(ctx, upstream, key=shared), await add_project(ctx, upstream, key=shared)]
    created.append(await add_project(ctx, upstream, key=other))
    dump = await database_dump(ctx)
    assert exposed(dump, [shared, other, *(project.token for project in created)]) == set()

    stored = await sealed_keys(ctx)
    assert len(stored) == 3
    stranger = KeyRing([new_master_key()])
    for project_id, provider, blob, key_id in stored:
        # version | master key id | 96-bit nonce | ciphertext | 128-bit tag
        assert blob[0] == 1
        assert blob[1:5].hex() == key_id == ctx.keyring.primary_key_id
        binding = secret_binding(project_id=project_id, provider=provider, purpose=API_KEY_PURPOSE)
        opened = ctx.keyring.open(blob, aad=binding).decode()
        assert opened in (shared, other)
        assert len(blob) == 1 + 4 + 12 + len(opened) + 16
        with pytest.raises(DecryptionError):
            stranger.open(blob, aad=binding)
        with pytest.raises(InvalidTag):  # a wrong key fails authentication: it never yields garbage
            AESGCM(new_master_key()).decrypt(blob[5:17], blob[17:], binding)
    nonces = {blob[5:17] for _, _, blob, _ in stored}
    assert len(nonces) == len({blob for _, _, blob, _ in stored}) == 3  # the shared key sealed twice, differently


@pytest.mark.parametrize("damage", ["moved", "flipped", "truncated"])
async def test_se07_a_moved_damaged_or_cut_ciphertext_is_refused_with_a_5xx_and_its_key_never_sent(
    damage: str, gateway_url: str, ctx: Context, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    (a, a_token), (b, b_token) = [await projects.create_project(ctx, name=name, actor="t") for name in "ab"]
    a_key = await connect(ctx, a.id, "openai", f"{upstream.url}/echo/a")
    b_key = await connect(ctx, b.id, "openai", f"{upstream.url}/echo/b")
    await connect(ctx, b.id, "spare", f"{upstream.url}/echo/b-spare")
    blobs = {project_id: blob for project_id, provider, blob, _ in await sealed_keys(ctx) if provider == "openai"}
    flipped = bytearray(blobs[b.id])
    flipped[-1] ^= 1
    replacement = {"moved": blobs[a.id], "flipped": bytes(flipped), "truncated": blobs[b.id][:-8]}[damage]
    b_integration = await integrations.get_integration(ctx, project_id=b.id, provider="openai")
    async with ctx.database.engine.begin() as connection:
        await connection.execute(
            text("UPDATE provider_keys SET ciphertext = :blob WHERE integration_id = :id"),
            {"blob": replacement, "id": b_integration.id},
        )
    ctx.access.invalidate()  # as a change by another instance would

    async with gateway_client(gateway_url) as http:
        refused = await http.post("/proxy/openai/x", content=CHAT, headers=bearer(b_token))
        spare = await http.post("/proxy/spare/x", content=CHAT, headers=bearer(b_token))
        owner = await http.post("/proxy/openai/x", content=CHAT, headers=bearer(a_token))
    assert refused.status_code >= 500
    assert_service_error(refused, refused.status_code)
    assert (spare.status_code, owner.status_code) == (200, 200)  # the damage stays with that one key
    assert [received.path_qs for received in upstream.received] == ["/echo/b-spare/x", "/echo/a/x"]
    assert exposed(wire_of(upstream.received[0]), [a_key, b_key]) == set()
    assert [record for record in caplog.records if record.exc_info and record.exc_info[0] is DecryptionError]


async def test_se08_master_key_rotation_under_traffic_survives_a_kill_and_retires_the_old_key(
    gateway_url: str, ctx: Context, settings: Settings, database: tuple[str, dict[str, Any]], upstream: Upstream
) -> None:
    """`credgate master-key rotate` while requests flow, each opening its key from the database again (scaled:
    ten integrations at some fifty requests a second, not the catalogue's 200). The first run is killed
    (SIGKILL) once it holds both keys; a second run finishes the job. No request may fail, and afterwards the
    old key opens nothing."""
    pairs = []
    for index in range(10):
        project, token = await projects.create_project(ctx, name=f"r{index}", actor="t")
        pairs.append((token, await connect(ctx, project.id, "openai", f"{upstream.url}/echo/r{index}")))
    old_keys = read_key_file(settings.master_key_file)
    statuses: list[int] = []
    flowing = True

    async def traffic() -> None:
        async with aiohttp.ClientSession() as http:
            while flowing:
                for token, _ in pairs:
                    ctx.access.invalidate()  # every request opens its key from the database again
                    url = f"{gateway_url}/proxy/openai/x"
                    async with http.post(url, data=CHAT, headers=bearer(token)) as response:
                        statuses.append(response.status)
                    await asyncio.sleep(0.02)  # some fifty requests a second, leaving the CPU to the rotation

    env = {**os.environ, "CREDGATE_DATA_DIR": str(settings.data_dir), "CREDGATE_DATABASE_URL": database[0]}
    load = asyncio.create_task(traffic())
    try:
        interrupted = await asyncio.create_subprocess_exec(CREDGATE, "master-key", "rotate", env=env)
        async with asyncio.timeout(30):
            while len(read_key_file(settings.master_key_file)) < 2:  # noqa: ASYNC110  (another process writes it)
                await asyncio.sleep(0.01)
        interrupted.kill()
        await interrupted.wait()
        assert len(read_key_file(settings.master_key_file)) == 2  # killed mid-way: both keys still held
        finished = await asyncio.create_subprocess_exec(CREDGATE, "master-key", "rotate", env=env)
        assert await finished.wait() == 0
    finally:
        flowing = False
        await load

    (final,) = read_key_file(settings.master_key_file)
    assert final not in old_keys
    assert len(statuses) > 50
    assert set(statuses) == {200}
    stored = await sealed_keys(ctx)
    assert (
        {key_id for *_, key_id in stored}
        == {blob[1:5].hex() for _, _, blob, _ in stored}
        == {master_key_id(final).hex()}
    )
    retired = KeyRing(old_keys)
    for project_id, provider, blob, _ in stored:
        with pytest.raises(DecryptionError):
            retired.open(blob, aad=secret_binding(project_id=project_id, provider=provider, purpose=API_KEY_PURPOSE))
    upstream.received.clear()
    ctx.access.invalidate()
    async with gateway_client(gateway_url) as http:
        for token, _ in pairs:
            assert (await http.post("/proxy/openai/x", content=CHAT, headers=bearer(token))).status_code == 200
    assert [received.header("authorization") for received in upstream.received] == [f"Bearer {key}" for _, key in pairs]


async def test_se09_serve_refuses_to_start_without_the_master_key_that_opens_the_database(
    ctx: Context, settings: Settings, database: tuple[str, dict[str, Any]], upstream: Upstream, tmp_path: Path
) -> None:
    """No key, a wrong key, a key file that cannot be read: the start is refused, says why without any key, and
    changes nothing. `credgate serve` itself runs for the wrong key (exit 5); the other two go through the same
    start-up in process, which is what `serve` calls first."""
    key = canary()
    await add_project(ctx, upstream, key=key)
    real_key = settings.master_key_file.read_text().strip()
    wrong_key = encode_master_key(new_master_key())
    database_file = Path(database[0].split("///", 1)[1])

    wrong = copy_installation(settings.data_dir, database_file, tmp_path / "wrong")
    before = rows_of(wrong / "credgate.db")
    env = {
        **os.environ,
        "CREDGATE_DATA_DIR": str(wrong / "data"),
        "CREDGATE_DATABASE_URL": f"sqlite+aiosqlite:///{wrong / 'credgate.db'}",
        "CREDGATE_LOG_LEVEL": "debug",
        "CREDGATE_MASTER_KEY": wrong_key,
    }
    serve = await asyncio.create_subprocess_exec(
        CREDGATE, "serve", "--port", str(free_port()), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with asyncio.timeout(60):
        output = (await serve.communicate())[0].decode(errors="replace")
    SWEEP.capture("serve refused", output)
    assert serve.returncode == 5, output
    assert "the master key does not match this database" in output
    assert "credgate is serving" not in output
    refusals = {"wrong": (output, before, rows_of(wrong / "credgate.db"))}

    for name, message in (("missing", "there is no master key"), ("unreadable", "cannot read the master key file")):
        place = copy_installation(settings.data_dir, database_file, tmp_path / name)
        (place / "data" / "master.key").unlink()
        if name == "unreadable":
            (place / "data" / "master.key").mkdir()
        before = rows_of(place / "credgate.db")
        copy = Settings(data_dir=place / "data", database_url=f"sqlite+aiosqlite:///{place / 'credgate.db'}")
        with pytest.raises(StartupError, match=message) as refused:
            await open_context(copy)
        refusals[name] = (str(refused.value), before, rows_of(place / "credgate.db"))
    for name, (said, before, after) in refusals.items():
        assert not [secret for secret in (real_key, wrong_key, key) if secret in said], name
        assert after == before, name  # a refused start changes nothing
    assert not (tmp_path / "missing" / "data" / "master.key").exists()  # and generates no new key


def copy_installation(data_dir: Path, database_file: Path, place: Path) -> Path:
    """A copy of a data dir and its SQLite database in `place`."""
    shutil.copytree(data_dir, place / "data")
    with sqlite3.connect(database_file) as source, sqlite3.connect(place / "credgate.db") as copy:
        source.backup(copy)
    return place


def rows_of(database_file: Path) -> list[str]:
    """The SQLite database's schema and rows, as SQL."""
    with sqlite3.connect(database_file) as database:
        return list(database.iterdump())


@ON_BOTH_BACKENDS
async def test_se10_only_sha256_hashes_of_tokens_are_stored_and_a_stored_hash_opens_nothing(
    gateway_url: str, ctx: Context, upstream: Upstream
) -> None:
    setup_token = await panel_sessions.issue_setup_token(ctx)  # issued only while no admin exists
    assert setup_token is not None
    project = await add_project(ctx, upstream)
    admin_token = await admins.create_admin_token(ctx, name="t", actor="t")
    await admins.create_admin_user(ctx, username="admin", password=PASSWORD, actor="t")
    session, _ = await panel_sessions.sign_in(ctx, username="admin", password=PASSWORD)
    tokens = [project.token, admin_token, session, setup_token]

    dump = await database_dump(ctx)
    assert exposed(dump, tokens) == set()
    assert all(hash_token(token).encode() in dump for token in tokens[:3])  # SHA-256, the only form stored
    held = {token: hash_token(token) for token in tokens}
    async with gateway_client(gateway_url) as http:
        for presented in (held[project.token], "cgp_" + held[project.token]):
            assert_service_error(await http.post(CHAT_PATH, content=CHAT, headers=bearer(presented)), 401)
        for presented in (held[admin_token], "cga_" + held[admin_token]):
            assert_service_error(await http.get("/api/v1/projects", headers=bearer(presented)), 401)
        http.cookies.set("credgate_session", held[session])
        assert (await http.get("/admin/projects")).headers["location"] == "/admin/login"
        assert (await http.get("/admin/setup", params={"token": held[setup_token]})).status_code == 404
    assert upstream.received == []


# SE-11, SE-12: what reaches an upstream


async def test_se11_line_breaks_and_nul_in_stored_values_are_refused_at_save_and_never_reach_an_upstream(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream, admin_token: str
) -> None:
    api = f"/api/v1/projects/{project.id}/integrations"
    injected = "X-Injected: 1"
    refused: list[tuple[str, str, dict[str, Any], str]] = [
        ("PUT", f"{api}/openai/key", {"api_key": f"sk-good\r\n{injected}"}, "api_key"),
        ("PUT", f"{api}/openai/key", {"api_key": f"sk-good\n{injected}"}, "api_key"),
        ("PUT", f"{api}/openai/key", {"api_key": "sk-good\x00tail"}, "api_key"),
        ("PATCH", f"{api}/openai", {"headers": {"X-Default": f"v\r\n{injected}"}}, "headers"),
        ("PATCH", f"{api}/openai", {"headers": {"X-Default\r\nX-Injected": "1"}}, "headers"),
        ("PATCH", f"{api}/openai", {"base_url": f"{upstream.url}/v1\r\n{injected}"}, "base_url"),
        (
            "PATCH",
            f"{api}/openai",
            {"auth": {"method": "header", "name": "x-key", "prefix": f"k\r\n{injected} "}},
            "auth",
        ),
        ("PATCH", f"{api}/openai", {"auth": {"method": "header", "name": "x-key\r\nX-Injected"}}, "auth"),
        ("POST", api, {"provider": "other", "base_url": f"{upstream.url}\r\n", "api_key": canary()}, "base_url"),
    ]
    admin_headers = {"Authorization": f"Bearer {admin_token}"}
    async with gateway_client(gateway_url, headers=admin_headers) as http:
        before = await state_of(http, project.id)
        for method, path, body, field in refused:
            response = await http.request(method, path, json=body)
            assert_service_error(response, 422)
            assert response.json()["error"]["message"].startswith(field)
            assert injected not in response.text
        assert await state_of(http, project.id) == before
        # What is accepted is made harmless: a default query value is percent-encoded, a key's spaces trimmed.
        spaced = canary()
        assert (await http.put(f"{api}/openai/key", json={"api_key": f"  {spaced}  "})).status_code == 200
        assert (await http.patch(f"{api}/openai", json={"query": {"q": f"v\r\n{injected}"}})).status_code == 200
        assert (await http.post(CHAT_PATH, content=CHAT, headers=bearer(project.token))).status_code == 200
    received = upstream.last
    assert "x-injected" not in received.header_names()
    assert received.path_qs.endswith("?q=v%0D%0AX-Injected%3A%201")
    assert received.header("authorization") == f"Bearer {spaced}"


class CountingListener:
    """A TCP listener that counts connections and answers nothing: a stand-in for an HTTP proxy."""

    def __init__(self) -> None:
        self.connections = 0
        self.url = ""

    async def _accept(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()


@asynccontextmanager
async def listening(ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[CountingListener]:
    listener = CountingListener()
    server = await asyncio.start_server(listener._accept, "127.0.0.1", 0, ssl=ssl_context)
    listener.url = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield listener
    finally:
        server.close()


def self_signed_tls(directory: Path) -> ssl.SSLContext:
    """A server TLS context with a fresh self-signed certificate for 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    (directory / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "cert.pem", directory / "key.pem")
    return context


async def test_se12_the_outbound_client_ignores_proxy_netrc_and_key_log_variables(
    ctx: Context, settings: Settings, database: tuple[str, dict[str, Any]], upstream: Upstream, tmp_path: Path
) -> None:
    """A real `credgate serve` started with HTTP(S)_PROXY and ALL_PROXY pointing at a listener, NETRC naming
    credentials for the upstream's host, and SSLKEYLOGFILE. Its requests must go straight to the upstream
    without those credentials, and no TLS session secret may be written (Python's default TLS context, and so
    aiohttp's, honours SSLKEYLOGFILE: it would get the secrets of connections that carry provider keys)."""
    project, token = await projects.create_project(ctx, name="env", actor="t")
    in_header = HeaderAuth(method="header", name="x-api-key")  # leaves Authorization free for .netrc to fill
    await connect(ctx, project.id, "plain", upstream.url, auth=in_header)
    netrc_password = canary()
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login netrc-user password {netrc_password}\n")
    netrc.chmod(0o600)
    key_log = tmp_path / "keys.log"
    async with listening() as proxy, listening(self_signed_tls(tmp_path)) as tls_upstream:
        await connect(ctx, project.id, "tls", f"https://{tls_upstream.url}")
        variables = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
        extra = {name: f"http://{proxy.url}" for name in variables}
        extra |= {"NETRC": str(netrc), "SSLKEYLOGFILE": str(key_log), "CREDGATE_DATABASE_URL": database[0]}
        process, running = start_gateway(settings.data_dir, tmp_path / "gateway.log", extra)
        try:
            async with gateway_client(running.url, trust_env=False) as http:
                plain = await http.get("/proxy/plain/echo/x", headers=bearer(token))
                tls = await http.get("/proxy/tls/x", headers=bearer(token))
        finally:
            stop_gateway(process, running)
    assert plain.status_code == 200
    assert proxy.connections == 0
    assert upstream.last.header("authorization") is None
    assert exposed(wire_of(upstream.last), [netrc_password]) == set()
    assert tls.status_code == 502  # the self-signed certificate is refused, once the handshake is under way
    assert "SSLCertVerificationError" in running.log.read_text()
    written = key_log.read_text().splitlines() if key_log.exists() else []
    assert [line for line in written if line and not line.startswith("#")] == []


# SE-13: the supply chain, as far as one machine can check it


def test_se13_h11_is_at_least_0_16_which_fixed_chunked_request_smuggling() -> None:
    assert tuple(int(part) for part in version("h11").split(".")[:2]) >= (0, 16)


LOCKS = Path(__file__).parents[2] / "requirements"
_LOCKED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?P<pin>\S*)(?P<rest>[^\n]*(?:\n[ \t]+[^\n]*)*)", re.M)


def locked(lock: str) -> dict[str, tuple[str, list[str]]]:
    """A lock file's requirements: name → (what follows the name up to a marker, its hashes). Options (another
    index, an editable, another file) and a package locked twice (once per platform, say) are refused: the tests
    below would not see what they bring."""
    text = (LOCKS / lock).read_text()
    assert re.findall(r"(?m)^-.*", text) == []
    entries: dict[str, tuple[str, list[str]]] = {}
    for entry in _LOCKED.finditer(text):
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", entry["rest"])
        name = canonicalize_name(entry["name"])
        assert name not in entries, f"{name} is locked twice"
        entries[name] = (entry["pin"], hashes)
    return entries


@pytest.mark.parametrize("lock", ["serve.lock", "test.lock"])
def test_se13_every_locked_package_is_pinned_to_one_version_with_the_hashes_of_its_files(lock: str) -> None:
    """What scripts/_venv.sh installs with --require-hashes: pip refuses any file whose hash is not listed, and
    any package (a new dependency of a dependency, say) that the lock does not pin."""
    entries = locked(lock)
    assert len(entries) > 40
    unpinned = {name: pin for name, (pin, _) in entries.items() if not re.fullmatch(r"==[0-9][0-9A-Za-z.+!-]*", pin)}
    unhashed = [name for name, (_, hashes) in entries.items() if not hashes]
    assert (unpinned, unhashed) == ({}, [])


def test_se13_the_gateway_is_served_with_the_versions_it_is_tested_with() -> None:
    tested = locked("test.lock")
    served = locked("serve.lock")
    assert {name: pin for name, (pin, _) in served.items()} == {name: tested[name][0] for name in served}
    assert served.keys() < tested.keys()  # the test tools come on top


@pytest.mark.parametrize(("lock", "extras"), [("serve.lock", ("postgres", "redis", "otel")), ("test.lock", ("dev",))])
def test_se13_each_lock_holds_what_pyproject_asks_for_at_a_version_it_allows(
    lock: str, extras: tuple[str, ...]
) -> None:
    """pyproject.toml's ranges and the lock in step: a dependency added to one and not the other fails here (and
    at installation, where `pip check` refuses the gateway's own) until scripts/lock has run."""
    project = tomllib.loads((LOCKS.parent / "pyproject.toml").read_text())["project"]
    asked = [*project["dependencies"], *(line for extra in extras for line in project["optional-dependencies"][extra])]
    entries = locked(lock)
    missing = []
    for line in asked:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue  # another platform's
        pin = entries.get(canonicalize_name(requirement.name), ("", []))[0]
        if not pin.startswith("==") or not requirement.specifier.contains(pin[2:], prereleases=True):
            missing.append(f"{requirement} (locked: {pin or 'nothing'})")
    assert missing == []


# .pth files run at every interpreter start: the way the LiteLLM 1.82.7/1.82.8 releases ran their payload.
KNOWN_PTH_CODE = {"distutils-precedence.pth", "a1_coverage.pth"}  # setuptools, and coverage (a dev dependency)


def test_se13_no_pth_file_outside_the_known_set_runs_code_at_interpreter_start() -> None:
    folders: Iterable[str] = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    running_code = {
        path.name
        for folder in folders
        for path in Path(folder).glob("*.pth")
        if any(line.startswith(("import ", "import\t")) for line in path.read_text(errors="replace").splitlines())
    }
    assert running_code <= KNOWN_PTH_CODE, f"unexpected .pth files that run code: {running_code - KNOWN_PTH_CODE}"
