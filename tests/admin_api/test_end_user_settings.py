"""Admin API: a project's browser and end-user settings (allowed origins, the per-end-user rate limit, the trusted
identity provider) and per-end-user budgets."""

from typing import Any

import httpx
import pytest

PROJECTS = "/api/v1/projects"
IDENTITY = {
    "jwks_url": "https://auth.example/.well-known/jwks.json",
    "issuer": "https://auth.example/",
    "audience": "app",
}


async def create(client: httpx.AsyncClient) -> str:
    response = await client.post(PROJECTS, json={"name": "demo"})
    assert response.status_code == 201
    project_id: str = response.json()["project"]["id"]
    return project_id


async def patch(client: httpx.AsyncClient, project_id: str, **changes: Any) -> httpx.Response:
    return await client.patch(f"{PROJECTS}/{project_id}", json=changes)


async def test_a_new_project_lets_no_page_in_and_trusts_no_identity_provider(client: httpx.AsyncClient) -> None:
    project = (await client.get(f"{PROJECTS}/{await create(client)}")).json()
    assert project["allowed_origins"] == []
    assert project["subject_rate_limit_per_minute"] is None
    assert project["identity_provider"] is None


async def test_the_settings_are_set_shown_and_cleared(client: httpx.AsyncClient) -> None:
    project_id = await create(client)

    changed = await patch(
        client,
        project_id,
        allowed_origins=["https://App.example:443", "http://localhost:5173"],
        subject_rate_limit_per_minute=30,
        identity_provider=IDENTITY,
    )

    assert changed.status_code == 200
    assert changed.json()["allowed_origins"] == ["https://app.example", "http://localhost:5173"]
    assert changed.json()["subject_rate_limit_per_minute"] == 30
    assert changed.json()["identity_provider"] == IDENTITY
    untouched = await patch(client, project_id, name="renamed")
    assert untouched.json()["allowed_origins"] == ["https://app.example", "http://localhost:5173"]
    assert untouched.json()["identity_provider"] == IDENTITY
    cleared = await patch(
        client, project_id, allowed_origins=[], subject_rate_limit_per_minute=None, identity_provider=None
    )
    assert cleared.json()["allowed_origins"] == []
    assert cleared.json()["subject_rate_limit_per_minute"] is None
    assert cleared.json()["identity_provider"] is None


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"allowed_origins": ["https://app.example/page"]}, "allowed_origins.0"),
        ({"allowed_origins": "https://app.example"}, "allowed_origins"),
        ({"allowed_origins": [f"https://{index}.example" for index in range(101)]}, "allowed_origins"),
        ({"subject_rate_limit_per_minute": 0}, "subject_rate_limit_per_minute"),
        ({"identity_provider": {**IDENTITY, "jwks_url": "ftp://auth.example/keys"}}, "identity_provider.jwks_url"),
        ({"identity_provider": {"issuer": "x", "audience": "y"}}, "identity_provider.jwks_url"),
        ({"identity_provider": {**IDENTITY, "audience": ""}}, "identity_provider.audience"),
    ],
)
async def test_invalid_settings_are_refused_naming_the_field(
    client: httpx.AsyncClient, changes: dict[str, Any], field: str
) -> None:
    project_id = await create(client)
    refused = await patch(client, project_id, **changes)
    assert refused.status_code == 422
    assert field in refused.json()["error"]["message"]
    assert (await client.get(f"{PROJECTS}/{project_id}")).json()["allowed_origins"] == []


async def test_one_issuer_and_audience_find_one_project(client: httpx.AsyncClient) -> None:
    first, second = await create(client), await create(client)
    assert (await patch(client, first, identity_provider=IDENTITY)).status_code == 200
    conflict = await patch(client, second, identity_provider=IDENTITY)
    assert conflict.status_code == 409
    assert first in conflict.json()["error"]["message"]
    assert (await patch(client, second, identity_provider={**IDENTITY, "audience": "other"})).status_code == 200
    assert (await patch(client, first, identity_provider=IDENTITY)).status_code == 200  # its own: no conflict


async def test_a_per_end_user_budget_says_so(client: httpx.AsyncClient) -> None:
    project_id = await create(client)
    added = await client.post(
        f"{PROJECTS}/{project_id}/budgets",
        json={"metric": "requests", "limit": 100, "period": "day", "per_subject": True},
    )
    assert added.status_code == 201
    assert added.json()["per_subject"] is True
    plain = await client.post(
        f"{PROJECTS}/{project_id}/budgets", json={"metric": "requests", "limit": 100, "period": "month"}
    )
    assert plain.json()["per_subject"] is False


async def test_usage_can_be_grouped_by_end_user(client: httpx.AsyncClient) -> None:
    project_id = await create(client)
    grouped = await client.get(f"{PROJECTS}/{project_id}/usage", params={"group_by": "subject"})
    assert grouped.status_code == 200
    assert grouped.json()["group_by"] == "subject"
    assert (await client.get(f"{PROJECTS}/{project_id}/usage", params={"group_by": "user"})).status_code == 422
