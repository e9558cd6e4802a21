"""Admin API, integrations: templates, custom ones, endpoints, provider keys (README, Admin API)."""

from typing import Any

import httpx
import pytest

from credgate.crypto import Secret
from credgate.resolved import ResolvedIntegration
from credgate.services.access import resolve_access
from credgate.services.context import Context
from tests.conftest import ONE_DATABASE

KEY = "sk-test-" + "abcdefghijklmnopqrst" + "uvwx"
OTHER_KEY = "sk-test-" + "zyxwvutsrqponmlkjihg" + "9876"
CHAT, IMAGES = "openai-chat-completions", "openai-image-generations"
OPENAI = "https://api.openai.com/v1"
INTEGRATION_KEYS = {
    "provider", "base_url", "auth", "templates", "endpoints", "headers", "query",
    "enabled", "timeout_seconds", "stream_idle_timeout_seconds", "total_timeout_seconds", "private_networks", "key",
    "keys", "key_strategy", "prices", "verify_call",
    "created_at", "updated_at",
}  # fmt: skip


async def new_project(client: httpx.AsyncClient) -> str:
    response = await client.post("/api/v1/projects", json={"name": "demo"})
    assert response.status_code == 201
    project_id: str = response.json()["project"]["id"]
    return project_id


def url(project_id: str, provider: str = "", suffix: str = "") -> str:
    base = f"/api/v1/projects/{project_id}/integrations"
    return f"{base}/{provider}{suffix}" if provider else base


async def add(client: httpx.AsyncClient, project_id: str, **body: Any) -> httpx.Response:
    return await client.post(url(project_id), json=body)


async def added(client: httpx.AsyncClient, project_id: str, **body: Any) -> dict[str, Any]:
    """A new integration (201)."""
    response = await add(client, project_id, **body)
    assert response.status_code == 201, response.text
    integration: dict[str, Any] = response.json()
    return integration


async def custom(client: httpx.AsyncClient, project_id: str, provider: str = "acme") -> dict[str, Any]:
    return await added(client, project_id, provider=provider, base_url="https://api.acme.test/v2", api_key=KEY)


def message_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    message: str = response.json()["error"]["message"]
    return message


# templates


async def test_template_needs_api_key_at_first_setup(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    response = await add(client, project_id, provider="openai", template=CHAT)
    assert "api_key" in message_of(response, 422)
    assert (await client.get(url(project_id))).json() == {"items": []}


async def test_template_integration(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    integration = await added(client, project_id, provider="openai", template=CHAT, api_key=KEY)
    assert set(integration) == INTEGRATION_KEYS
    expected = {
        "provider": "openai", "base_url": OPENAI, "auth": {"method": "bearer"}, "templates": [CHAT],
        "endpoints": [{"method": "POST", "path": "chat/completions"}], "enabled": True, "timeout_seconds": 600,
        "stream_idle_timeout_seconds": 300, "total_timeout_seconds": 3600, "private_networks": [],
    }  # fmt: skip
    assert {name: integration[name] for name in expected} == expected
    assert (integration["key"]["status"], integration["key"]["hint"]) == ("active", "…uvwx")
    assert (await client.get(url(project_id, "openai"))).json() == integration


async def test_second_template_adds_endpoints_and_keeps_the_key(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    first = await added(client, project_id, provider="openai", template=CHAT, api_key=KEY)
    response = await add(client, project_id, provider="openai", template=IMAGES)
    assert response.status_code == 200
    second = response.json()
    assert second["templates"] == [CHAT, IMAGES]
    assert {"method": "POST", "path": "images/generations"} in second["endpoints"]
    assert {"method": "POST", "path": "chat/completions"} in second["endpoints"]
    assert second["key"] == first["key"]
    assert len((await client.get(url(project_id))).json()["items"]) == 1


async def test_second_template_with_api_key_is_409(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    first = await added(client, project_id, provider="openai", template=CHAT, api_key=KEY)
    response = await add(client, project_id, provider="openai", template=IMAGES, api_key=OTHER_KEY)
    message_of(response, 409)
    assert (await client.get(url(project_id, "openai"))).json() == first


async def test_two_accounts_of_one_provider(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    work = await added(client, project_id, provider="openai-work", template=CHAT, api_key=KEY)
    home = await added(client, project_id, provider="openai_home", template=CHAT, api_key=OTHER_KEY)
    assert (work["key"]["hint"], home["key"]["hint"]) == ("…uvwx", "…9876")
    assert work["base_url"] == home["base_url"] == OPENAI
    items = (await client.get(url(project_id))).json()["items"]
    assert sorted(item["provider"] for item in items) == ["openai-work", "openai_home"]


async def test_template_base_url_override(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    base_url = "https://eu.openai.test/v1"
    integration = await added(client, project_id, provider="openai", template=CHAT, api_key=KEY, base_url=base_url)
    assert integration["base_url"] == "https://eu.openai.test/v1"
    assert integration["endpoints"] == [{"method": "POST", "path": "chat/completions"}]


async def test_unknown_template_is_422(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    response = await add(client, project_id, provider="openai", template="no-such-template", api_key=KEY)
    assert "template" in message_of(response, 422)


async def test_integrations_belong_to_one_project(client: httpx.AsyncClient) -> None:
    first, second = await new_project(client), await new_project(client)
    await added(client, first, provider="openai", template=CHAT, api_key=KEY)
    assert (await client.get(url(second))).json() == {"items": []}
    assert (await client.get(url(second, "openai"))).status_code == 404
    await added(client, second, provider="openai", template=CHAT, api_key=OTHER_KEY)


# custom integrations


@pytest.mark.parametrize(
    ("auth", "key"),
    [
        (None, KEY),
        ({"method": "bearer"}, KEY),
        ({"method": "header", "name": "x-api-key"}, KEY),
        ({"method": "header", "name": "Authorization", "prefix": "Token "}, KEY),
        ({"method": "query", "name": "key"}, KEY),
        ({"method": "basic"}, "user:" + KEY),
    ],
)
async def test_custom_integration(client: httpx.AsyncClient, auth: dict[str, str] | None, key: str) -> None:
    project_id = await new_project(client)
    body: dict[str, Any] = {"provider": "acme", "base_url": "https://api.acme.test/v2", "api_key": key}
    integration = await added(client, project_id, **body, **({"auth": auth} if auth else {}))
    assert set(integration) == INTEGRATION_KEYS
    assert integration["auth"].items() >= (auth or {"method": "bearer"}).items()
    assert (integration["endpoints"], integration["templates"]) == ([], [])
    assert integration["base_url"] == "https://api.acme.test/v2"
    assert (integration["key"]["status"], integration["key"]["hint"]) == ("active", "…uvwx")


@ONE_DATABASE
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"api_key": KEY}, "base_url"),
        ({"base_url": "https://api.acme.test"}, "api_key"),
        ({"base_url": "https://api.acme.test", "api_key": ""}, "api_key"),
        ({"base_url": "https://api.acme.test", "api_key": "   "}, "api_key"),
        ({"base_url": "https://api.acme.test", "api_key": KEY, "auth": {"method": "basic"}}, "api_key"),
        ({"base_url": "https://api.acme.test", "api_key": KEY, "auth": {"method": "magic"}}, "auth"),
        ({"base_url": "https://api.acme.test", "api_key": KEY, "auth": {"method": "header"}}, "auth"),
        ({"base_url": "https://api.acme.test", "api_key": KEY, "auth": {"method": "query"}}, "auth"),
        ({"base_url": "ftp://api.acme.test", "api_key": KEY}, "base_url"),
        ({"base_url": "api.acme.test", "api_key": KEY}, "base_url"),
        ({"base_url": "https://api.acme.test", "api_key": KEY, "colour": "red"}, "colour"),
    ],
)
async def test_invalid_custom_integration_is_422(client: httpx.AsyncClient, body: dict[str, Any], field: str) -> None:
    project_id = await new_project(client)
    assert field in message_of(await add(client, project_id, provider="acme", **body), 422)
    assert (await client.get(url(project_id))).json() == {"items": []}


async def test_duplicate_custom_integration_is_409(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    first = await custom(client, project_id)
    response = await add(client, project_id, provider="acme", base_url="https://other.acme.test", api_key=OTHER_KEY)
    message_of(response, 409)
    assert (await client.get(url(project_id, "acme"))).json() == first


@ONE_DATABASE
@pytest.mark.parametrize("provider", ["OpenAI", "a" * 64, "-openai", "_openai", "", "open ai", "open.ai", "openai/x"])
async def test_invalid_provider_name_is_422(client: httpx.AsyncClient, provider: str) -> None:
    project_id = await new_project(client)
    for body in ({"template": CHAT}, {"base_url": "https://api.acme.test"}):
        assert "provider" in message_of(await add(client, project_id, provider=provider, api_key=KEY, **body), 422)
    assert (await client.get(url(project_id))).json() == {"items": []}


async def test_longest_provider_name_is_accepted(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    provider = "0" + "a-_" * 20 + "zz"
    assert len(provider) == 63
    await custom(client, project_id, provider)
    assert (await client.get(url(project_id, provider))).status_code == 200


# endpoints


async def put_endpoints(client: httpx.AsyncClient, project_id: str, endpoints: list[dict[str, str]]) -> httpx.Response:
    return await client.put(url(project_id, "acme", "/endpoints"), json={"endpoints": endpoints})


async def test_put_endpoints_replaces_the_allow_list(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)
    endpoints = [
        {"method": "GET", "path": "models"},
        {"method": "*", "path": "files/*/content"},
        {"method": "POST", "path": "v1/**"},
        {"method": "DELETE", "path": "*"},
    ]
    response = await put_endpoints(client, project_id, endpoints)
    assert response.status_code == 200
    assert response.json()["endpoints"] == endpoints
    response = await put_endpoints(client, project_id, [{"method": "PATCH", "path": "a/b"}])
    assert response.json()["endpoints"] == [{"method": "PATCH", "path": "a/b"}]
    assert (await client.get(url(project_id, "acme"))).json()["endpoints"] == [{"method": "PATCH", "path": "a/b"}]


async def test_put_endpoints_may_empty_a_template_integration(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    await added(client, project_id, provider="openai", template=CHAT, api_key=KEY)
    response = await client.put(url(project_id, "openai", "/endpoints"), json={"endpoints": []})
    assert response.status_code == 200
    assert response.json()["endpoints"] == []
    assert response.json()["templates"] == [CHAT]
    assert response.json()["key"]["status"] == "active"


@ONE_DATABASE
@pytest.mark.parametrize(
    "endpoint",
    [
        {"method": "GET", "path": ".."},
        {"method": "GET", "path": "a/../b"},
        {"method": "GET", "path": "a/./b"},
        {"method": "GET", "path": "**/models"},
        {"method": "GET", "path": "a*b"},
        {"method": "GET", "path": "models*"},
        {"method": "GET", "path": "***"},
        {"method": "GET", "path": ""},
        {"method": "GET", "path": "a//b"},
        {"method": "CONNECT", "path": "models"},
        {"path": "models"},
        {"method": "GET"},
    ],
)
async def test_invalid_endpoint_is_422(client: httpx.AsyncClient, endpoint: dict[str, str]) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)
    valid = {"method": "GET", "path": "models"}
    assert "endpoints" in message_of(await put_endpoints(client, project_id, [valid, endpoint]), 422)
    assert (await client.get(url(project_id, "acme"))).json()["endpoints"] == []


# provider keys


async def test_put_key_rotates_it(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    before = (await custom(client, project_id))["key"]
    response = await client.put(url(project_id, "acme", "/key"), json={"api_key": OTHER_KEY})
    assert response.status_code == 200
    key = response.json()["key"]
    assert key["status"] == "active"
    assert key["hint"] == "…9876"
    assert key["updated_at"] >= before["updated_at"]
    assert OTHER_KEY not in response.text


async def test_delete_key_revokes_it(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)
    response = await client.delete(url(project_id, "acme", "/key"))
    assert response.status_code == 200
    assert set(response.json()) == INTEGRATION_KEYS
    assert response.json()["key"]["status"] == "revoked"
    assert response.json()["key"]["hint"] is None
    assert (await client.get(url(project_id, "acme"))).json()["key"]["status"] == "revoked"


async def resolved(ctx: Context, secret: str) -> ResolvedIntegration:
    """The acme integration as the proxy sees it now, for this project token."""
    access = await resolve_access(ctx, token=secret, provider="acme")
    assert access is not None
    assert access.integration is not None
    return access.integration


async def test_changes_take_effect_for_the_next_request(client: httpx.AsyncClient, ctx: Context) -> None:
    created = (await client.post("/api/v1/projects", json={"name": "demo"})).json()
    project_id, secret = created["project"]["id"], created["secret"]
    await custom(client, project_id)
    assert (await resolved(ctx, secret)).credential == Secret(KEY)
    await client.put(url(project_id, "acme", "/key"), json={"api_key": OTHER_KEY})
    assert (await resolved(ctx, secret)).credential == Secret(OTHER_KEY)
    await client.patch(url(project_id, "acme"), json={"enabled": False, "base_url": "https://new.acme.test"})
    assert (await resolved(ctx, secret)).enabled is False
    assert (await resolved(ctx, secret)).base_url == "https://new.acme.test"
    await client.delete(url(project_id, "acme", "/key"))
    assert (await resolved(ctx, secret)).credential is None


async def test_put_key_after_revoke_makes_it_active_again(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)
    await client.delete(url(project_id, "acme", "/key"))
    response = await client.put(url(project_id, "acme", "/key"), json={"api_key": OTHER_KEY})
    assert response.json()["key"]["status"] == "active"
    assert response.json()["key"]["hint"] == "…9876"


async def test_short_key_is_not_given_away_by_its_hint(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)
    response = await client.put(url(project_id, "acme", "/key"), json={"api_key": "wxyz"})
    assert response.status_code == 200
    assert response.json()["key"]["status"] == "active"
    assert "wxyz" not in response.text


@pytest.mark.parametrize("body", [{}, {"api_key": ""}, {"api_key": " \t "}, {"api_key": 42}, {"key": KEY}])
async def test_invalid_key_is_422(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    project_id = await new_project(client)
    before = await custom(client, project_id)
    response = await client.put(url(project_id, "acme", "/key"), json=body)
    assert "api_key" in message_of(response, 422)
    assert (await client.get(url(project_id, "acme"))).json()["key"] == before["key"]


# patch


@pytest.mark.parametrize(
    "change",
    [
        {"base_url": "https://eu.acme.test/v3"},
        {"auth": {"method": "header", "name": "x-api-key", "prefix": "Key "}},
        {"auth": {"method": "query", "name": "api_key"}},
        {"enabled": False},
        {"headers": {"OpenAI-Beta": "assistants=v2", "x-team": "data"}},
        {"query": {"api-version": "2024-06-01"}},
        {"timeout_seconds": 30},
        {"timeout_seconds": 2.5},
        {"stream_idle_timeout_seconds": 12.5},
        {"stream_idle_timeout_seconds": 3600},
        {"total_timeout_seconds": 0.5},
        {"total_timeout_seconds": 86400},
    ],
)
async def test_patch_changes_only_the_fields_given(client: httpx.AsyncClient, change: dict[str, Any]) -> None:
    project_id = await new_project(client)
    before = await custom(client, project_id)
    response = await client.patch(url(project_id, "acme"), json=change)
    assert response.status_code == 200
    after = response.json()
    assert {name: after[name] for name in change} == change
    unchanged = INTEGRATION_KEYS - set(change) - {"updated_at"}
    assert {name: after[name] for name in unchanged} == {name: before[name] for name in unchanged}
    assert (await client.get(url(project_id, "acme"))).json() == after


async def test_patch_enabled_back_on(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)
    await client.patch(url(project_id, "acme"), json={"enabled": False})
    response = await client.patch(url(project_id, "acme"), json={"enabled": True})
    assert response.json()["enabled"] is True


@ONE_DATABASE
@pytest.mark.parametrize(
    "change",
    [
        {"base_url": "ftp://acme.test"},
        {"base_url": "not a url"},
        {"base_url": "https://user:pass@acme.test"},
        {"base_url": "https://acme.test/v1?key=1"},
        {"auth": {"method": "magic"}},
        {"auth": {"method": "header"}},
        {"auth": {"method": "basic"}},
        {"enabled": "maybe"},
        {"headers": {"bad header": "x"}},
        {"headers": {"x-team": "a\r\nx-evil: 1"}},
        {"headers": {"Host": "evil.test"}},
        {"headers": ["x-team"]},
        {"query": {"": "x"}},
        {"query": "a=1"},
        {"timeout_seconds": 0},
        {"timeout_seconds": -1},
        {"timeout_seconds": "fast"},
        {"timeout_seconds": "30"},
        {"stream_idle_timeout_seconds": 0},
        {"stream_idle_timeout_seconds": 3601},
        {"total_timeout_seconds": 0},
        {"total_timeout_seconds": 86401},
        {"total_timeout_seconds": "NaN"},
        {"provider": "renamed"},
    ],
)
async def test_patch_rejects_invalid_values(client: httpx.AsyncClient, change: dict[str, Any]) -> None:
    project_id = await new_project(client)
    before = await custom(client, project_id)
    response = await client.patch(url(project_id, "acme"), json=change)
    assert next(iter(change)) in message_of(response, 422)
    assert (await client.get(url(project_id, "acme"))).json() == before


# delete and unknown names


async def test_delete_integration(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)
    await custom(client, project_id, "other")
    response = await client.delete(url(project_id, "acme"))
    assert response.status_code == 204
    assert response.content == b""
    assert (await client.get(url(project_id, "acme"))).status_code == 404
    assert [item["provider"] for item in (await client.get(url(project_id))).json()["items"]] == ["other"]
    await custom(client, project_id)  # the name is free again


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("GET", "", None),
        ("PATCH", "", {"enabled": False}),
        ("DELETE", "", None),
        ("PUT", "/endpoints", {"endpoints": []}),
        ("PUT", "/key", {"api_key": KEY}),
        ("DELETE", "/key", None),
    ],
)
async def test_unknown_provider_is_404(
    client: httpx.AsyncClient, method: str, suffix: str, body: dict[str, Any] | None
) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)
    response = await client.request(method, url(project_id, "nobody", suffix), json=body)
    message_of(response, 404)


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("GET", "", None),
        ("POST", "", {"provider": "acme", "base_url": "https://api.acme.test", "api_key": KEY}),
        ("POST", "", {"provider": "openai", "template": CHAT, "api_key": KEY}),
        ("GET", "/acme", None),
        ("PUT", "/acme/key", {"api_key": KEY}),
    ],
)
async def test_unknown_project_is_404(
    client: httpx.AsyncClient, method: str, suffix: str, body: dict[str, Any] | None
) -> None:
    response = await client.request(method, url("prj_0000000000000000") + suffix, json=body)
    message_of(response, 404)
