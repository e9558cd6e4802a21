"""The guard on the one error shape (README, Errors): every source of an admin API error answers
`{"error": {"status", "message"}}`, the same status, JSON, and `X-Credgate-Error: true`; never a key."""

import re
from typing import Any

import httpx
import pytest

KEY = "sk-test-" + "abcdefghijklmnopqrst" + "uvwx"
CUSTOM = {"provider": "acme", "base_url": "https://api.acme.test", "api_key": KEY}


def service_error(response: httpx.Response, status: int) -> str:
    """Check the envelope and return its message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].split(";")[0] == "application/json"
    assert response.headers["x-credgate-error"] == "true"
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"status", "message"}
    assert body["error"]["status"] == status
    message = body["error"]["message"]
    assert isinstance(message, str)
    assert message
    return message


@pytest.fixture
def backend() -> str:
    """The envelope is made by the HTTP layer, whatever the database: one is enough (the routes' own tests, and
    tests/storage, run on both)."""
    return "sqlite"


async def new_project(client: httpx.AsyncClient) -> str:
    response = await client.post("/api/v1/projects", json={"name": "demo"})
    assert response.status_code == 201
    project_id: str = response.json()["project"]["id"]
    return project_id


# 401


@pytest.mark.parametrize(
    "path", ["/api/v1/projects", "/api/v1/templates", "/api/v1/audit", "/api/v1/projects/prj_0000000000000000"]
)
async def test_missing_admin_token_is_401(anonymous: httpx.AsyncClient, path: str) -> None:
    response = await anonymous.get(path)
    service_error(response, 401)
    assert response.headers["www-authenticate"].lower().startswith("bearer")


@pytest.mark.parametrize(
    "authorization",
    ["Bearer cga_wrong", "Bearer cgp_0000000000000000000000000000", "Bearer ", "Basic YWRtaW46YWRtaW4=", "cga_x"],
)
async def test_bad_admin_token_is_401(client: httpx.AsyncClient, authorization: str, admin_token: str) -> None:
    response = await client.get("/api/v1/projects", headers={"Authorization": authorization})
    service_error(response, 401)
    assert response.headers["www-authenticate"].lower().startswith("bearer")
    assert admin_token not in response.text


async def test_project_token_is_not_an_admin_token(client: httpx.AsyncClient) -> None:
    secret = (await client.post("/api/v1/projects", json={"name": "demo"})).json()["secret"]
    service_error(await client.get("/api/v1/projects", headers={"Authorization": f"Bearer {secret}"}), 401)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/v1/projects", {"name": ""}),
        ("PATCH", "/api/v1/projects/prj_0000000000000000", {"name": "x"}),
        ("POST", "/api/v1/projects/prj_0000000000000000/integrations", CUSTOM),
    ],
)
async def test_token_is_checked_before_the_input(
    anonymous: httpx.AsyncClient, method: str, path: str, body: dict[str, str]
) -> None:
    service_error(await anonymous.request(method, path, json=body), 401)


async def test_token_is_checked_before_parsing_the_body(anonymous: httpx.AsyncClient) -> None:
    response = await anonymous.post(
        "/api/v1/projects", content=b'{"name": ', headers={"content-type": "application/json"}
    )
    service_error(response, 401)


# 404, 405, 409


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/nothing-here"),
        ("GET", "/nothing-here"),
        ("GET", "/api/v2/projects"),
        ("GET", "/api/v1/projects/prj_0000000000000000"),
        ("DELETE", "/api/v1/projects/prj_0000000000000000"),
        ("GET", "/api/v1/projects/{project}/integrations/nobody"),
        ("DELETE", "/api/v1/projects/{project}/integrations/nobody/key"),
        ("GET", "/api/v1/projects/prj_0000000000000000/requests"),
        ("GET", "/api/v1/projects/prj_0000000000000000/usage"),
    ],
)
async def test_not_found_is_404(client: httpx.AsyncClient, method: str, path: str) -> None:
    path = path.format(project=await new_project(client))
    service_error(await client.request(method, path), 404)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/api/v1/projects"),
        ("DELETE", "/api/v1/templates"),
        ("POST", "/api/v1/audit"),
        ("GET", "/api/v1/projects/x/token"),
    ],
)
async def test_wrong_method_is_405(client: httpx.AsyncClient, method: str, path: str) -> None:
    response = await client.request(method, path)
    service_error(response, 405)
    assert response.headers.get("allow")


async def test_conflict_is_409(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    assert (await client.post(f"/api/v1/projects/{project_id}/integrations", json=CUSTOM)).status_code == 201
    response = await client.post(f"/api/v1/projects/{project_id}/integrations", json=CUSTOM)
    assert "acme" in service_error(response, 409)


# 422


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": 5}, "name"),
        ({}, "name"),
        ({"name": "x", "colour": "red"}, "colour"),
        ([], ""),
        ("demo", ""),
    ],
)
async def test_invalid_input_is_422_naming_the_field(client: httpx.AsyncClient, body: object, field: str) -> None:
    assert field in service_error(await client.post("/api/v1/projects", json=body), 422)


async def test_service_level_invalid_input_is_422(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    body = {"provider": "openai", "template": "openai-chat-completions"}
    response = await client.post(f"/api/v1/projects/{project_id}/integrations", json=body)
    assert "api_key" in service_error(response, 422)


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b'{"name": ', "application/json"),
        (b'{"name": "demo",}', "application/json"),
        (b"\xff\xfe", "application/json"),
        (b"name=demo", "application/x-www-form-urlencoded"),
        (b"", "application/json"),
    ],
)
async def test_malformed_body_is_422(client: httpx.AsyncClient, content: bytes, content_type: str) -> None:
    response = await client.post("/api/v1/projects", content=content, headers={"content-type": content_type})
    service_error(response, 422)
    assert (await client.get("/api/v1/projects")).json() == {"items": []}


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/api/v1/audit", {"limit": "many"}, "limit"),
        ("/api/v1/projects/{project}/requests", {"limit": 0}, "limit"),
        ("/api/v1/projects/{project}/usage", {"group_by": "week"}, "group_by"),
        ("/api/v1/projects/{project}/usage", {"since": "yesterday"}, "since"),
    ],
)
async def test_query_parameter_error_is_422(
    client: httpx.AsyncClient, path: str, params: dict[str, str | int], field: str
) -> None:
    path = path.format(project=await new_project(client))
    assert field in service_error(await client.get(path, params=params), 422)


# no key in an error


def leaks(response: httpx.Response, key: str) -> bool:
    text = "\n".join(f"{name}: {value}" for name, value in response.headers.items()) + response.text
    return any(part in text for part in key.split() if len(part) >= 8)


@pytest.mark.parametrize(
    "body",
    [
        {"provider": "OpenAI", "template": "openai-chat-completions", "api_key": KEY},
        {"provider": "-acme", "base_url": "https://api.acme.test", "api_key": KEY},
        {"provider": "acme", "base_url": "https://api.acme.test", "api_key": KEY + "\nx-evil: 1"},
        {"provider": "acme", "base_url": "https://api.acme.test", "api_key": "\x00" + KEY},
        {"provider": "acme", "base_url": "https://api.acme.test", "api_key": KEY * 400},
        {"provider": "acme", "base_url": "https://api.acme.test", "api_key": KEY, "auth": {"method": "basic"}},
        {"provider": "acme", "base_url": KEY, "api_key": KEY},
        {"provider": "acme", "base_url": "https://api.acme.test", "api_key": [KEY]},
        {"provider": "acme", "base_url": "https://api.acme.test", "api_key": {"value": KEY}},
        {"provider": "acme", "base_url": "https://api.acme.test", "api_key": KEY, "apikey": KEY},
        {"provider": "acme", "template": "openai-chat-completions", "api_key": KEY, "auth": {"method": "bearer"}},
    ],
)
async def test_invalid_integration_never_echoes_the_key(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    project_id = await new_project(client)
    response = await client.post(f"/api/v1/projects/{project_id}/integrations", json=body)
    service_error(response, 422)
    assert not leaks(response, KEY)


@pytest.mark.parametrize("value", [KEY[:10] + "\r\n" + KEY[10:], KEY + "\x7f", KEY * 400, [KEY], {"value": KEY}])
async def test_invalid_key_update_never_echoes_the_key(client: httpx.AsyncClient, value: object) -> None:
    project_id = await new_project(client)
    assert (await client.post(f"/api/v1/projects/{project_id}/integrations", json=CUSTOM)).status_code == 201
    response = await client.put(f"/api/v1/projects/{project_id}/integrations/acme/key", json={"api_key": value})
    assert "api_key" in service_error(response, 422)
    assert not leaks(response, KEY)


@pytest.mark.parametrize(
    "change",
    [
        {"headers": {"x-api-key": KEY + "\n"}},
        {"headers": {KEY + " ": "x"}},
        {"query": {"key": [KEY]}},
        {"base_url": KEY},
        {"headers": {KEY: 5}},
        {"query": {KEY: None}},
    ],
)
async def test_invalid_patch_never_echoes_a_value(client: httpx.AsyncClient, change: dict[str, Any]) -> None:
    project_id = await new_project(client)
    assert (await client.post(f"/api/v1/projects/{project_id}/integrations", json=CUSTOM)).status_code == 201
    response = await client.patch(f"/api/v1/projects/{project_id}/integrations/acme", json=change)
    service_error(response, 422)
    assert not leaks(response, KEY)


async def test_malformed_json_never_echoes_the_key(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    content = b'{"provider": "acme", "api_key": "' + KEY.encode() + b'" "base_url": 1}'
    response = await client.post(
        f"/api/v1/projects/{project_id}/integrations", content=content, headers={"content-type": "application/json"}
    )
    service_error(response, 422)
    assert not leaks(response, KEY)


# the OpenAPI document


async def test_openapi_document_lists_the_contract(client: httpx.AsyncClient) -> None:
    response = await client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    paths = {re.sub(r"\{[^}]+\}", "{}", path): set(item) for path, item in response.json()["paths"].items()}
    expected = {
        "/api/v1/projects": {"get", "post"},
        "/api/v1/projects/{}": {"get", "patch", "delete"},
        "/api/v1/projects/{}/token/rotate": {"post"},
        "/api/v1/projects/{}/token": {"delete"},
        "/api/v1/templates": {"get"},
        "/api/v1/projects/{}/integrations": {"get", "post"},
        "/api/v1/projects/{}/integrations/{}": {"get", "patch", "delete"},
        "/api/v1/projects/{}/integrations/{}/endpoints": {"put"},
        "/api/v1/projects/{}/integrations/{}/key": {"put", "delete"},
        "/api/v1/audit": {"get"},
        "/api/v1/projects/{}/requests": {"get"},
        "/api/v1/projects/{}/usage": {"get"},
        "/api/v1/client-tokens": {"post"},  # served by the proxy, documented with the admin API
    }
    missing = {path: methods - paths.get(path, set()) for path, methods in expected.items()}
    assert {path: methods for path, methods in missing.items() if methods} == {}
