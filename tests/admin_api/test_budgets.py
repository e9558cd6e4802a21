"""Budgets and price lists in the admin API: what each budget has spent this period, limits in the metric's unit
(dollars for cost), and input that makes no sense refused naming its field."""

from typing import Any

import httpx
import pytest

from tests.admin_api.test_integrations import custom, message_of, new_project, url
from tests.conftest import ONE_DATABASE


def budgets_url(project_id: str, budget_id: str = "") -> str:
    return f"/api/v1/projects/{project_id}/budgets" + (f"/{budget_id}" if budget_id else "")


async def test_a_budget_is_added_shown_with_its_period_changed_and_removed(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)

    added = await client.post(
        budgets_url(project_id),
        json={"metric": "cost", "limit": 12.5, "period": "month", "provider": "acme", "reserve": 0.05},
    )
    assert added.status_code == 201, added.text
    budget = added.json()
    assert {name: budget[name] for name in ("metric", "limit", "period", "provider", "spent")} == {
        "metric": "cost",
        "limit": 12.5,
        "period": "month",
        "provider": "acme",
        "spent": 0,
    }
    assert budget["period_start"].endswith("-01T00:00:00Z")
    assert budget["reserve"] == 0.05
    assert budget["id"].startswith("bud_")

    changed = await client.patch(budgets_url(project_id, budget["id"]), json={"limit": 20, "period": "day"})
    assert (changed.json()["limit"], changed.json()["period"]) == (20, "day")
    assert changed.json()["period_start"].endswith("T00:00:00Z")
    listed = await client.get(budgets_url(project_id))
    assert [found["id"] for found in listed.json()["items"]] == [budget["id"]]

    assert (await client.delete(budgets_url(project_id, budget["id"]))).status_code == 204
    assert (await client.get(budgets_url(project_id))).json() == {"items": []}
    assert (await client.delete(budgets_url(project_id, budget["id"]))).status_code == 404
    audited = (await client.get("/api/v1/audit", params={"project_id": project_id})).json()["items"]
    assert [event["action"] for event in audited][:3] == ["budget.remove", "budget.update", "budget.add"]


@ONE_DATABASE
@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"metric": "requests", "limit": 2.5, "period": "day"}, 422, "limit"),
        ({"metric": "tokens", "limit": -1, "period": "day"}, 422, "limit"),
        ({"metric": "cost", "limit": 0, "period": "day"}, 422, "limit"),
        ({"metric": "cost", "limit": 5, "period": "week"}, 422, "period"),
        ({"metric": "minutes", "limit": 5, "period": "day"}, 422, "metric"),
        ({"metric": "requests", "limit": 5, "period": "day", "provider": "nowhere"}, 404, ""),
        ({"metric": "requests", "limit": 5, "period": "day", "reserve": 1}, 422, "reserve"),
        ({"metric": "tokens", "limit": 5, "period": "day", "reserve": 6}, 422, "reserve"),
        ({"metric": "tokens", "limit": 5, "period": "day", "reserve": 1.5}, 422, "reserve"),
        ({"metric": "cost", "limit": 5, "period": "day", "reserve": -1}, 422, "reserve"),
    ],
)
async def test_a_budget_that_makes_no_sense_is_refused(
    client: httpx.AsyncClient, body: dict[str, object], status: int, field: str
) -> None:
    project_id = await new_project(client)
    message = message_of(await client.post(budgets_url(project_id), json=body), status)
    assert message.startswith(field)
    assert (await client.get(budgets_url(project_id))).json() == {"items": []}


async def test_a_price_list_is_replaced_whole_and_checked_line_by_line(client: httpx.AsyncClient) -> None:
    project_id = await new_project(client)
    await custom(client, project_id)
    prices: list[dict[str, Any]] = [
        {"model": "claude-3-5-haiku*", "input": 0.8, "output": 4},
        {"model": "*", "input": 3, "output": 15},
    ]

    stored = await client.put(url(project_id, "acme", "/prices"), json={"prices": prices})
    assert stored.status_code == 200, stored.text
    assert stored.json()["prices"] == [line | {"output": float(line["output"])} for line in prices]

    bad = [prices[0], {"model": "*", "input": "cheap", "output": 1}]
    assert message_of(await client.put(url(project_id, "acme", "/prices"), json={"prices": bad}), 422).startswith(
        "prices[2].input"
    )
    missing = [{"model": "x", "input": 1}]
    assert message_of(await client.put(url(project_id, "acme", "/prices"), json={"prices": missing}), 422).startswith(
        "prices[1]"
    )
    kept = await client.get(url(project_id, "acme"))
    assert kept.json()["prices"] == stored.json()["prices"]  # a refused list changes nothing
    assert (await client.put(url(project_id, "acme", "/prices"), json={"prices": []})).json()["prices"] == []
