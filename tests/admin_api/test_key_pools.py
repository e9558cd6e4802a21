"""The key pool in the admin API: add, list, relabel, disable, move and remove keys by their stable ids; the
single-key operations act on the pool; no secret in any answer."""

from typing import Any

import httpx

from credgate.limits import MAX_KEY_LABEL_LENGTH, MAX_KEYS_PER_INTEGRATION
from tests.admin_api.test_integrations import custom, message_of, new_project, url
from tests.secret_sweep import SWEEP

SECOND = "sk-second-0123456789abcdefwxyz"
THIRD = "sk-third-0123456789abcdefghi9"


def keys_url(project_id: str, key_id: str = "") -> str:
    return url(project_id, "acme", f"/keys/{key_id}" if key_id else "/keys")


async def pool(client: httpx.AsyncClient, project_id: str) -> list[dict[str, Any]]:
    listed = await client.get(keys_url(project_id))
    assert listed.status_code == 200
    keys: list[dict[str, Any]] = listed.json()["items"]
    return keys


async def test_keys_are_added_moved_disabled_and_removed_by_their_stable_ids(client: httpx.AsyncClient) -> None:
    SWEEP.register(SECOND)
    SWEEP.register(THIRD)
    project_id = await new_project(client)
    integration = await custom(client, project_id)
    [first] = integration["keys"]
    assert (first["position"], first["status"], first["label"]) == (0, "active", "")
    assert integration["key_strategy"] == "failover"

    second = await client.post(keys_url(project_id), json={"api_key": SECOND, "label": "backup"})
    assert second.status_code == 201
    assert {name: second.json()[name] for name in ("label", "position", "status", "hint", "failure")} == {
        "label": "backup",
        "position": 1,
        "status": "active",
        "hint": "…wxyz",
        "failure": None,
    }
    second_id = second.json()["id"]
    moved = await client.patch(keys_url(project_id, second_id), json={"position": 0, "disabled": True})
    assert moved.status_code == 200
    assert [(key["id"], key["status"]) for key in moved.json()["keys"]] == [
        (second_id, "disabled"),
        (first["id"], "active"),
    ]
    assert moved.json()["key"]["hint"] == "…wxyz"  # the single-key view shows the pool's first key

    # Rotating through the single-key operation keeps the first key's id.
    rotated = await client.put(url(project_id, "acme", "/key"), json={"api_key": THIRD})
    assert [key["id"] for key in rotated.json()["keys"]] == [second_id, first["id"]]
    assert rotated.json()["keys"][0]["hint"] == "…ghi9"

    removed = await client.delete(keys_url(project_id, second_id))
    assert [key["id"] for key in removed.json()["keys"]] == [first["id"]]
    assert message_of(await client.delete(keys_url(project_id, second_id)), 404).endswith(f"no key {second_id}")

    revoked = await client.delete(url(project_id, "acme", "/key"))
    assert [key["status"] for key in revoked.json()["keys"]] == ["revoked"]
    for answer in (second, moved, rotated, removed, revoked):
        assert SECOND not in answer.text
        assert THIRD not in answer.text


async def test_a_strategy_is_a_setting_of_the_integration(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)
    spread = await client.patch(url(project_id, "acme"), json={"key_strategy": "spread"})
    assert spread.json()["key_strategy"] == "spread"
    assert "key_strategy" in message_of(
        await client.patch(url(project_id, "acme"), json={"key_strategy": "random"}), 422
    )


async def test_bad_key_input_is_refused_naming_the_field_and_changes_nothing(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)
    [only] = await pool(client, project_id)
    long_label = {"api_key": SECOND, "label": "x" * (MAX_KEY_LABEL_LENGTH + 1)}
    assert "label" in message_of(await client.post(keys_url(project_id), json=long_label), 422)
    assert "api_key" in message_of(await client.post(keys_url(project_id), json={"api_key": ""}), 422)
    assert "position" in message_of(await client.patch(keys_url(project_id, only["id"]), json={"position": 1}), 422)
    assert message_of(await client.patch(keys_url(project_id, "key_nope"), json={"label": "x"}), 404)
    assert await pool(client, project_id) == [only]


async def test_a_pool_holds_at_most_its_limit_of_keys(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)
    for index in range(MAX_KEYS_PER_INTEGRATION - 1):
        key = f"sk-pool-{index:04d}-0123456789abcdef"
        SWEEP.register(key)
        assert (await client.post(keys_url(project_id), json={"api_key": key})).status_code == 201
    over = await client.post(keys_url(project_id), json={"api_key": "sk-one-too-many-0123456789ab"})
    assert f"{MAX_KEYS_PER_INTEGRATION} keys" in message_of(over, 409)
    assert len(await pool(client, project_id)) == MAX_KEYS_PER_INTEGRATION
