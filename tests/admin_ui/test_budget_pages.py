"""The panel's budgets and prices: a budget added (the form kept when it is refused), its limit changed, removed
after a confirmation; a price list edited as text, a bad line refused with the text kept."""

import re

import httpx

from credgate.services import budgets, integrations
from credgate.services.context import Context
from tests.admin_ui.test_security import signed_in_csrf


def rows(html: str) -> list[str]:
    body = html.split('<table class="budgets">', 1)[1].split("</table>", 1)[0]
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip() for row in body.split("<tr>")[2:]]


async def test_a_budget_is_added_its_limit_changed_and_removed_from_the_budgets_page(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}/budgets"
    assert "No budget: the project may spend without limit." in (await client.get(page)).text

    form = {"csrf": csrf, "metric": "cost", "limit": "$1,250.50", "period": "month", "provider": "openai"}
    added = await client.post(page, data=form | {"thresholds": "50%, 90%"}, follow_redirects=True)
    assert "Budget added" in added.text
    [row] = rows(added.text)
    assert row.startswith("Cost (dollars) a month alerts at 50%, 90% openai $0.00 (0%)")
    [state] = await budgets.list_budgets(ctx, project_id=project_id)
    assert (state.budget.amount, state.budget.provider, state.budget.thresholds) == (1_250_500_000, "openai", [50, 90])

    changed = await client.post(f"{page}/{state.budget.id}", data={"csrf": csrf, "limit": "99"}, follow_redirects=True)
    assert "Budget limit saved." in changed.text
    assert 'value="$99.00"' in changed.text
    refused = await client.post(f"{page}/{state.budget.id}", data={"csrf": csrf, "limit": "lots"})
    assert refused.status_code == 422
    assert "Must be a number." in refused.text

    confirm = await client.get(f"{page}/{state.budget.id}/remove")
    assert "Remove this budget?" in confirm.text
    removed = await client.post(f"{page}/{state.budget.id}/remove", data={"csrf": csrf}, follow_redirects=True)
    assert "Budget removed." in removed.text
    assert await budgets.list_budgets(ctx, project_id=project_id) == []


async def test_a_refused_budget_keeps_what_was_typed_and_says_what_is_wrong(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    form = {"csrf": csrf, "metric": "requests", "limit": "2.5", "period": "day", "provider": "openai"}
    refused = await client.post(f"/admin/projects/{project_id}/budgets", data=form)
    assert refused.status_code == 422
    assert "Must be a whole number of requests." in refused.text
    assert 'value="2.5"' in refused.text
    assert '<option value="day" selected>' in refused.text
    assert '<option value="openai" selected>' in refused.text
    assert await budgets.list_budgets(ctx, project_id=project_id) == []
    odd = await client.post(f"/admin/projects/{project_id}/budgets", data=form | {"limit": "5", "thresholds": "half"})
    assert "Must be at most 10 whole percentages from 1 to 100." in odd.text
    assert 'value="half"' in odd.text


async def test_a_price_list_is_edited_as_text_and_a_bad_line_keeps_the_text(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}/integrations/openai/prices"
    text = "gpt-4o-mini*  0.15  0.60\n\ngpt-4o* $2.50, $10\n"
    saved = await client.post(page, data={"csrf": csrf, "prices": text}, follow_redirects=True)
    assert "Prices of openai saved." in saved.text
    assert "gpt-4o-mini* 0.15 0.6\ngpt-4o* 2.5 10</textarea>" in saved.text
    found = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert found.prices == [
        {"model": "gpt-4o-mini*", "input": 0.15, "output": 0.6},
        {"model": "gpt-4o*", "input": 2.5, "output": 10.0},
    ]

    bad = "gpt-4o* 2.5 10\nclaude 3"
    refused = await client.post(page, data={"csrf": csrf, "prices": bad})
    assert refused.status_code == 422
    assert "Line 2 must be a model (or pattern) and two prices." in refused.text
    assert f">{bad}</textarea>" in refused.text
    negative = await client.post(page, data={"csrf": csrf, "prices": "x -1 2"})
    assert "Line 1, input: must be from 0 to 1,000,000,000 dollars per million tokens." in negative.text
    unchanged = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert len(unchanged.prices) == 2
