"""Admin API, projects and their tokens (README, Security and Admin API)."""

from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from credgate.services.access import resolve_access
from credgate.services.context import Context
from credgate.storage.models import ProviderKey

PROJECTS = "/api/v1/projects"
PROJECT_KEYS = {"id", "name", "created_at", "token"}  # at least these: more fields may be added
TOKEN_KEYS = {"prefix", "created_at", "expires_at", "last_used_at"}


async def create(client: httpx.AsyncClient, name: str = "demo") -> dict[str, Any]:
    response = await client.post(PROJECTS, json={"name": name})
    assert response.status_code == 201
    body: dict[str, Any] = response.json()
    return body


async def rotate(client: httpx.AsyncClient, project_id: str, **options: int | None) -> dict[str, Any]:
    response = await client.post(f"{PROJECTS}/{project_id}/token/rotate", json=options)
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


async def works(ctx: Context, secret: str) -> bool:
    """Whether the gateway would accept this project token now."""
    return await resolve_access(ctx, token=secret, provider="openai") is not None


async def sealed_keys(ctx: Context) -> list[ProviderKey]:
    """Every provider key still stored with a ciphertext."""
    async with ctx.database.transaction(write=False) as repo:
        return list(await repo.provider_keys_not_under("", limit=100))


def at(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    assert parsed.tzinfo is not None, f"{value} is not RFC 3339: no offset"
    return parsed


def freeze(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop the gateway's clock, so that `later` counts from the moment tokens were made, however slow the run."""
    later(ctx, monkeypatch, 0)


def later(ctx: Context, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    now = ctx.clock() + timedelta(seconds=seconds)
    monkeypatch.setattr(ctx, "clock", lambda: now)


async def test_create_answers_project_and_secret(client: httpx.AsyncClient, ctx: Context) -> None:
    created = await create(client, "demo")
    project, secret = created["project"], created["secret"]
    assert set(created) == {"project", "secret"}
    assert set(project) >= PROJECT_KEYS
    assert set(project["token"]) == TOKEN_KEYS
    assert project["name"] == "demo"
    assert secret.startswith("cgp_")
    assert len(secret) >= 36
    assert secret.startswith(project["token"]["prefix"])
    assert len(project["token"]["prefix"]) < len(secret) // 2
    assert project["token"]["expires_at"] is None
    assert project["token"]["last_used_at"] is None
    assert at(project["token"]["created_at"]) >= at(project["created_at"])
    assert await works(ctx, secret)


async def test_secret_is_shown_only_once(client: httpx.AsyncClient) -> None:
    created = await create(client)
    project_id, secret = created["project"]["id"], created["secret"]
    for path in (PROJECTS, f"{PROJECTS}/{project_id}", "/api/v1/audit"):
        response = await client.get(path)
        assert response.status_code == 200
        assert secret not in response.text
        assert secret[8:] not in response.text


async def test_each_project_gets_its_own_token(client: httpx.AsyncClient) -> None:
    first, second = await create(client, "same"), await create(client, "same")
    assert first["project"]["id"] != second["project"]["id"]
    assert first["secret"] != second["secret"]


async def test_list_holds_every_project(client: httpx.AsyncClient) -> None:
    assert (await client.get(PROJECTS)).json() == {"items": []}
    ids = {(await create(client, name))["project"]["id"] for name in ("a", "b", "a")}
    items = (await client.get(PROJECTS)).json()["items"]
    assert {item["id"] for item in items} == ids
    assert all(set(item) >= PROJECT_KEYS for item in items)


async def test_get_answers_the_project(client: httpx.AsyncClient) -> None:
    created = (await create(client, "demo"))["project"]
    response = await client.get(f"{PROJECTS}/{created['id']}")
    assert response.status_code == 200
    assert response.json() == created


async def test_rename(client: httpx.AsyncClient, ctx: Context) -> None:
    created = await create(client, "old")
    project_id = created["project"]["id"]
    response = await client.patch(f"{PROJECTS}/{project_id}", json={"name": "new"})
    assert response.status_code == 200
    assert response.json()["name"] == "new"
    assert response.json()["token"] == created["project"]["token"]
    assert (await client.get(f"{PROJECTS}/{project_id}")).json()["name"] == "new"
    assert await works(ctx, created["secret"])


@pytest.mark.parametrize("body", [{"name": ""}, {"name": "x" * 201}, {"name": 5}, {}, {"name": None}])
async def test_create_with_invalid_name_is_422_naming_it(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    response = await client.post(PROJECTS, json=body)
    assert response.status_code == 422
    assert "name" in response.json()["error"]["message"]
    assert (await client.get(PROJECTS)).json() == {"items": []}


@pytest.mark.parametrize(
    ("body", "field"), [({"name": ""}, "name"), ({"name": "x" * 201}, "name"), ({"name": "a", "colour": 1}, "colour")]
)
async def test_invalid_rename_is_422_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    project_id = (await create(client, "kept"))["project"]["id"]
    response = await client.patch(f"{PROJECTS}/{project_id}", json=body)
    assert response.status_code == 422
    assert field in response.json()["error"]["message"]
    assert (await client.get(f"{PROJECTS}/{project_id}")).json()["name"] == "kept"


async def test_delete_stops_the_token_at_once(client: httpx.AsyncClient, ctx: Context) -> None:
    created = await create(client)
    project_id = created["project"]["id"]
    assert await works(ctx, created["secret"])
    response = await client.delete(f"{PROJECTS}/{project_id}")
    assert response.status_code == 204
    assert response.content == b""
    assert (await client.get(f"{PROJECTS}/{project_id}")).status_code == 404
    assert not await works(ctx, created["secret"])
    assert (await client.get(PROJECTS)).json() == {"items": []}


async def test_delete_destroys_the_projects_secrets(client: httpx.AsyncClient, ctx: Context) -> None:
    project_id = (await create(client))["project"]["id"]
    body = {"provider": "acme", "base_url": "https://api.acme.test", "api_key": "sk-test-" + "k" * 24}
    assert (await client.post(f"{PROJECTS}/{project_id}/integrations", json=body)).status_code == 201
    assert len(await sealed_keys(ctx)) == 1
    assert (await client.delete(f"{PROJECTS}/{project_id}")).status_code == 204
    assert await sealed_keys(ctx) == []
    assert (await client.get(f"{PROJECTS}/{project_id}/integrations")).status_code == 404


async def test_rotate_without_grace_stops_the_old_token(client: httpx.AsyncClient, ctx: Context) -> None:
    created = await create(client)
    rotated = await rotate(client, created["project"]["id"])
    assert set(rotated) == {"project", "secret"}
    assert rotated["secret"].startswith("cgp_")
    assert rotated["secret"] != created["secret"]
    assert rotated["secret"].startswith(rotated["project"]["token"]["prefix"])
    assert not await works(ctx, created["secret"])
    assert await works(ctx, rotated["secret"])


async def test_rotate_accepts_an_empty_body(client: httpx.AsyncClient, ctx: Context) -> None:
    created = await create(client)
    response = await client.post(f"{PROJECTS}/{created['project']['id']}/token/rotate")
    assert response.status_code == 200
    assert await works(ctx, response.json()["secret"])
    assert not await works(ctx, created["secret"])


async def test_rotate_grace_keeps_the_old_token_for_a_while(
    client: httpx.AsyncClient, ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    freeze(ctx, monkeypatch)
    created = await create(client)
    rotated = await rotate(client, created["project"]["id"], grace_seconds=60)
    later(ctx, monkeypatch, 59)
    assert await works(ctx, created["secret"])
    assert await works(ctx, rotated["secret"])
    later(ctx, monkeypatch, 2)
    assert not await works(ctx, created["secret"])
    assert await works(ctx, rotated["secret"])


async def test_rotate_with_expiry(client: httpx.AsyncClient, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    freeze(ctx, monkeypatch)
    project_id = (await create(client))["project"]["id"]
    rotated = await rotate(client, project_id, expires_in_seconds=3600)
    token = rotated["project"]["token"]
    assert at(token["expires_at"]) - at(token["created_at"]) == timedelta(seconds=3600)
    assert (await client.get(f"{PROJECTS}/{project_id}")).json()["token"] == token
    later(ctx, monkeypatch, 3599)
    assert await works(ctx, rotated["secret"])
    later(ctx, monkeypatch, 2)
    assert not await works(ctx, rotated["secret"])


async def test_rotate_grace_never_extends_a_shorter_expiry(
    client: httpx.AsyncClient, ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    freeze(ctx, monkeypatch)
    project_id = (await create(client))["project"]["id"]
    short = await rotate(client, project_id, expires_in_seconds=10)
    await rotate(client, project_id, grace_seconds=3600)
    later(ctx, monkeypatch, 11)
    assert not await works(ctx, short["secret"])


async def test_rotate_explicit_null_expiry_never_expires(client: httpx.AsyncClient, ctx: Context) -> None:
    project_id = (await create(client))["project"]["id"]
    rotated = await rotate(client, project_id, grace_seconds=0, expires_in_seconds=None)
    assert rotated["project"]["token"]["expires_at"] is None
    assert await works(ctx, rotated["secret"])


@pytest.mark.parametrize(
    ("field", "value"),
    [("grace_seconds", -1), ("grace_seconds", "soon"), ("expires_in_seconds", 0), ("expires_in_seconds", -5)],
)
async def test_rotate_rejects_invalid_durations(
    client: httpx.AsyncClient, ctx: Context, field: str, value: object
) -> None:
    created = await create(client)
    response = await client.post(f"{PROJECTS}/{created['project']['id']}/token/rotate", json={field: value})
    assert response.status_code == 422
    assert field in response.json()["error"]["message"]
    assert await works(ctx, created["secret"])


async def test_revoke_stops_every_token_until_the_next_rotate(client: httpx.AsyncClient, ctx: Context) -> None:
    created = await create(client)
    project_id = created["project"]["id"]
    graced = await rotate(client, project_id, grace_seconds=3600)
    response = await client.delete(f"{PROJECTS}/{project_id}/token")
    assert response.status_code == 204
    assert response.content == b""
    assert not await works(ctx, created["secret"])
    assert not await works(ctx, graced["secret"])
    assert (await client.get(f"{PROJECTS}/{project_id}")).json()["token"] is None
    assert await works(ctx, (await rotate(client, project_id))["secret"])


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("GET", "", None),
        ("PATCH", "", {"name": "x"}),
        ("DELETE", "", None),
        ("POST", "/token/rotate", {}),
        ("DELETE", "/token", None),
    ],
)
async def test_unknown_project_is_404(
    client: httpx.AsyncClient, method: str, suffix: str, body: dict[str, str] | None
) -> None:
    await create(client)
    response = await client.request(method, f"{PROJECTS}/prj_0000000000000000{suffix}", json=body)
    assert response.status_code == 404
    assert response.json()["error"]["status"] == 404
