"""Admin API, the template catalogue and the audit record (README, Admin API)."""

from datetime import datetime
from typing import Any

import httpx

KEY = "sk-test-" + "abcdefghijklmnopqrst" + "uvwx"
OTHER_KEY = "sk-test-" + "zyxwvutsrqponmlkjihg" + "9876"
TEMPLATE_KEYS = {"id", "provider", "name", "description", "base_url", "auth", "endpoints", "headers", "query"}
AUDIT_KEYS = {"at", "actor", "action", "project_id", "provider", "detail"}


async def templates(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    response = await client.get("/api/v1/templates")
    assert response.status_code == 200
    assert set(response.json()) == {"items"}
    return {template["id"]: template for template in response.json()["items"]}


async def audit(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await client.get("/api/v1/audit")
    assert response.status_code == 200
    assert set(response.json()) == {"items"}
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def new_project(client: httpx.AsyncClient) -> tuple[str, str]:
    response = await client.post("/api/v1/projects", json={"name": "demo"})
    assert response.status_code == 201
    return response.json()["project"]["id"], response.json()["secret"]


async def add_openai(client: httpx.AsyncClient, project_id: str) -> None:
    body = {"provider": "openai", "template": "openai-chat-completions", "api_key": KEY}
    assert (await client.post(f"/api/v1/projects/{project_id}/integrations", json=body)).status_code == 201


# templates


async def test_openai_templates(client: httpx.AsyncClient) -> None:
    found = await templates(client)
    for template_id, path in [
        ("openai-chat-completions", "chat/completions"),
        ("openai-image-generations", "images/generations"),
    ]:
        template = found[template_id]
        assert set(template) == TEMPLATE_KEYS
        assert template["provider"] == "openai"
        assert template["base_url"] == "https://api.openai.com/v1"
        assert template["auth"] == {"method": "bearer"}
        assert {"method": "POST", "path": path} in template["endpoints"]
        assert template["name"]
        assert isinstance(template["description"], str)


async def test_every_template_is_well_formed(client: httpx.AsyncClient) -> None:
    for template_id, template in (await templates(client)).items():
        assert set(template) == TEMPLATE_KEYS
        assert template["id"] == template_id
        assert template["base_url"].startswith("https://")
        assert template["endpoints"], f"{template_id} allows no endpoint"
        assert all(set(endpoint) == {"method", "path"} for endpoint in template["endpoints"])
        assert isinstance(template["headers"], dict)
        assert isinstance(template["query"], dict)


async def test_template_endpoints_become_the_integrations(client: httpx.AsyncClient) -> None:
    template = (await templates(client))["openai-image-generations"]
    project_id, _ = await new_project(client)
    body = {"provider": "images", "template": template["id"], "api_key": KEY}
    integration = (await client.post(f"/api/v1/projects/{project_id}/integrations", json=body)).json()
    assert integration["endpoints"] == template["endpoints"]
    assert (integration["base_url"], integration["auth"]) == (template["base_url"], template["auth"])


# audit


async def test_audit_records_changes_newest_first(client: httpx.AsyncClient) -> None:
    before = len(await audit(client))
    project_id, _ = await new_project(client)
    await add_openai(client, project_id)
    await client.delete(f"/api/v1/projects/{project_id}/integrations/openai/key")
    events = await audit(client)
    assert len(events) == before + 3
    newest, middle, oldest = events[:3]
    assert [event["provider"] for event in events[:3]] == ["openai", "openai", None]
    assert all(event["project_id"] == project_id for event in events[:3])
    assert len({newest["action"], middle["action"], oldest["action"]}) == 3
    times = [datetime.fromisoformat(event["at"]) for event in events]
    assert all(time.tzinfo is not None for time in times)
    assert times == sorted(times, reverse=True)


async def test_audit_event_shape_and_actor(client: httpx.AsyncClient) -> None:
    project_id, _ = await new_project(client)
    event = (await audit(client))[0]
    assert set(event) == AUDIT_KEYS
    assert event["project_id"] == project_id
    assert event["provider"] is None
    assert "tests" in event["actor"]  # the admin token's name: who made the change
    assert "project" in event["action"]


async def test_audit_records_each_kind_of_change(client: httpx.AsyncClient) -> None:
    project_id, _ = await new_project(client)
    base = f"/api/v1/projects/{project_id}"
    await client.patch(base, json={"name": "renamed"})
    await client.post(f"{base}/token/rotate", json={})
    await client.delete(f"{base}/token")
    await add_openai(client, project_id)
    await client.patch(f"{base}/integrations/openai", json={"enabled": False})
    await client.put(f"{base}/integrations/openai/endpoints", json={"endpoints": []})
    await client.put(f"{base}/integrations/openai/key", json={"api_key": OTHER_KEY})
    await client.delete(f"{base}/integrations/openai")
    await client.delete(base)
    events = [event for event in await audit(client) if event["project_id"] == project_id]
    assert len(events) == 10
    assert len({event["action"] for event in events}) == 10


async def test_audit_ignores_reads_and_rejected_changes(client: httpx.AsyncClient) -> None:
    project_id, _ = await new_project(client)
    await add_openai(client, project_id)
    before = await audit(client)
    await client.get(f"/api/v1/projects/{project_id}/integrations/openai")
    await client.get("/api/v1/projects")
    body = {"provider": "openai", "template": "openai-image-generations", "api_key": OTHER_KEY}
    assert (await client.post(f"/api/v1/projects/{project_id}/integrations", json=body)).status_code == 409
    assert (await client.patch(f"/api/v1/projects/{project_id}", json={"name": ""})).status_code == 422
    assert await audit(client) == before


async def test_audit_never_holds_a_secret(client: httpx.AsyncClient, admin_token: str) -> None:
    project_id, secret = await new_project(client)
    await add_openai(client, project_id)
    await client.put(f"/api/v1/projects/{project_id}/integrations/openai/key", json={"api_key": OTHER_KEY})
    rotated = (await client.post(f"/api/v1/projects/{project_id}/token/rotate", json={})).json()["secret"]
    text = (await client.get("/api/v1/audit")).text
    for value in (KEY, OTHER_KEY, secret, rotated, admin_token):
        assert value not in text
        assert value[-12:] not in text


async def test_audit_filters_by_project_and_limits(client: httpx.AsyncClient) -> None:
    first, _ = await new_project(client)
    await new_project(client)
    await add_openai(client, first)
    response = await client.get("/api/v1/audit", params={"project_id": first})
    assert [event["project_id"] for event in response.json()["items"]] == [first, first]
    assert len((await client.get("/api/v1/audit", params={"limit": 1})).json()["items"]) == 1
    assert (await client.get("/api/v1/audit", params={"limit": 0})).status_code == 422
