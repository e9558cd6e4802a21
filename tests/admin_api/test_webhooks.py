"""Webhooks, the delivery log, key promotion and the key age policy in the admin API: the signing secret in the
creating answer only, unknown event types and bad URLs refused naming the field, every change audited."""

import httpx

from tests.admin_api.test_integrations import custom, message_of, new_project
from tests.admin_api.test_key_pools import keys_url
from tests.secret_sweep import SWEEP

RECEIVER = "https://hooks.example.test/credgate"


def hooks_url(project_id: str, webhook_id: str = "") -> str:
    return f"/api/v1/projects/{project_id}/webhooks" + (f"/{webhook_id}" if webhook_id else "")


async def test_a_webhook_shows_its_secret_once_and_is_changed_tested_and_removed(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    created = await client.post(hooks_url(project_id), json={"url": RECEIVER, "events": ["budget.threshold"]})
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]
    # Shown once by design, like a new project token: not a stored secret for the sweep. The checks below keep
    # it out of every other answer.
    assert secret.startswith("whsec_")
    assert len(secret) > 30
    webhook = created.json()["webhook"]
    assert {name: webhook[name] for name in ("url", "events", "enabled")} == {
        "url": RECEIVER,
        "events": ["budget.threshold"],
        "enabled": True,
    }

    listed = await client.get(hooks_url(project_id))
    assert secret not in listed.text
    assert [found["id"] for found in listed.json()["items"]] == [webhook["id"]]
    changed = await client.patch(hooks_url(project_id, webhook["id"]), json={"events": [], "enabled": False})
    assert (changed.json()["events"], changed.json()["enabled"]) == ([], False)
    tested = await client.post(hooks_url(project_id, webhook["id"]) + "/test")
    assert tested.status_code == 202
    assert tested.json()["type"] == "webhook.test"
    [delivery] = (await client.get(f"/api/v1/projects/{project_id}/deliveries")).json()["items"]
    assert (delivery["event_id"], delivery["event_type"], delivery["webhook_id"]) == (
        tested.json()["id"],
        "webhook.test",
        webhook["id"],
    )
    assert delivery["status"] == "pending"  # this app has no running dispatcher: nothing posts it

    assert (await client.delete(hooks_url(project_id, webhook["id"]))).status_code == 204
    assert (await client.get(hooks_url(project_id))).json() == {"items": []}
    assert (await client.get(f"/api/v1/projects/{project_id}/deliveries")).json() == {"items": []}
    audited = (await client.get("/api/v1/audit", params={"project_id": project_id})).json()["items"]
    assert [event["action"] for event in audited][:4] == [
        "webhook.remove",
        "webhook.test",
        "webhook.update",
        "webhook.add",
    ]
    for answer in (listed, changed, tested):
        assert secret not in answer.text


async def test_a_webhook_that_could_never_work_is_refused_naming_the_field(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    for body, field in (
        ({"url": "ftp://hooks.example.test/x"}, "url"),
        ({"url": "https://user:pw@hooks.example.test/x"}, "url"),
        ({"url": RECEIVER, "events": ["budget.spent"]}, "events"),
        ({"url": RECEIVER, "events": "budget.threshold"}, "events"),
    ):
        assert message_of(await client.post(hooks_url(project_id), json=body), 422).startswith(field)
    assert (await client.get(hooks_url(project_id))).json() == {"items": []}
    assert (await client.post(hooks_url(project_id, "whk_nothing") + "/test")).status_code == 404


async def test_a_key_is_promoted_with_its_predecessor_retired_after_the_overlap(client: httpx.AsyncClient) -> None:
    second = "sk-second-promoted-0000000wxyz"
    SWEEP.register(second)
    project_id = await new_project(client)
    integration = await custom(client, project_id)
    first_id = integration["keys"][0]["id"]
    added = (await client.post(keys_url(project_id), json={"api_key": second})).json()

    promoted = await client.post(
        keys_url(project_id, added["id"]) + "/promote", json={"retire_previous_after_seconds": 3600}
    )
    assert promoted.status_code == 200, promoted.text
    keys = promoted.json()["keys"]
    assert [key["id"] for key in keys] == [added["id"], first_id]
    assert keys[0]["retire_at"] is None
    assert keys[1]["retire_at"] is not None
    assert keys[0]["secret_set_at"] == added["secret_set_at"]
    too_long = {"retire_previous_after_seconds": 31 * 86400}
    assert message_of(await client.post(keys_url(project_id, first_id) + "/promote", json=too_long), 422).startswith(
        "retire_previous_after_seconds"
    )


async def test_a_projects_key_age_policy_and_a_budgets_thresholds_are_set_and_checked(
    client: httpx.AsyncClient,
) -> None:
    project_id = await new_project(client)
    patched = await client.patch(f"/api/v1/projects/{project_id}", json={"key_max_age_days": 90})
    assert patched.json()["key_max_age_days"] == 90
    assert message_of(
        await client.patch(f"/api/v1/projects/{project_id}", json={"key_max_age_days": 0}), 422
    ).startswith("key_max_age_days")
    cleared = await client.patch(f"/api/v1/projects/{project_id}", json={"key_max_age_days": None})
    assert cleared.json()["key_max_age_days"] is None

    budget = {"metric": "requests", "limit": 10, "period": "day"}
    added = await client.post(f"/api/v1/projects/{project_id}/budgets", json=budget | {"thresholds": [90, 50, 90]})
    assert added.json()["thresholds"] == [50, 90]
    assert (await client.post(f"/api/v1/projects/{project_id}/budgets", json=budget)).json()["thresholds"] == [80, 100]
    refused = await client.post(f"/api/v1/projects/{project_id}/budgets", json=budget | {"thresholds": [0]})
    assert message_of(refused, 422).startswith("thresholds")
