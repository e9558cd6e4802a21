"""The panel's key pool page: keys added, moved, disabled, enabled and removed, the strategy chosen, a key the
provider refused shown with its reason; no key ever on a page."""

import re

import httpx
import pytest

from credgate.services import integrations, key_pools
from credgate.services.context import Context
from tests.admin_ui.conftest import KEY
from tests.admin_ui.test_security import signed_in_csrf
from tests.secret_sweep import SWEEP

SECOND = "sk-test-panel-second-key-00wxyz"


def page_of(project_id: str) -> str:
    return f"/admin/projects/{project_id}/integrations/openai/keys"


def key_rows(html: str) -> list[str]:
    """Each row of the pool table, as text."""
    body = html.split('<table class="keys pool">', 1)[1].split("</table>", 1)[0]
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip() for row in body.split("<tr>")[2:]]


async def test_a_key_is_added_moved_disabled_enabled_and_removed_from_the_pool_page(
    client: httpx.AsyncClient,
    ctx: Context,
    project_id: str,
) -> None:
    SWEEP.register(SECOND)
    csrf = await signed_in_csrf(client)
    page = page_of(project_id)
    added = await client.post(page, data={"csrf": csrf, "label": "backup", "api_key": SECOND}, follow_redirects=True)
    assert added.status_code == 200
    assert "Key added to openai" in added.text
    rows = key_rows(added.text)
    assert rows[0].startswith("1 — …qrst active")
    assert rows[1].startswith("2 backup …wxyz active")
    second_id = (await integrations.get_integration(ctx, project_id=project_id, provider="openai")).keys[1].id

    await client.post(f"{page}/{second_id}", data={"csrf": csrf, "action": "up"})
    await client.post(f"{page}/{second_id}", data={"csrf": csrf, "action": "disable"})
    found = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert (found.keys[0].id, key_pools.key_state(found.keys[0])) == (second_id, "disabled")
    await client.post(f"{page}/{second_id}", data={"csrf": csrf, "action": "enable"})

    confirm = await client.get(f"{page}/{second_id}/remove")
    assert "Remove this key from the pool?" in confirm.text
    removed = await client.post(f"{page}/{second_id}/remove", data={"csrf": csrf}, follow_redirects=True)
    assert len(key_rows(removed.text)) == 1
    for answer in (added, confirm, removed):
        assert SECOND not in answer.text
        assert KEY not in answer.text


async def test_a_bad_key_keeps_the_label_and_says_the_key_must_be_entered_again(
    client: httpx.AsyncClient,
    project_id: str,
) -> None:
    csrf = await signed_in_csrf(client)
    pasted = "sk-test-with\nnewline-000000000000"
    answer = await client.post(page_of(project_id), data={"csrf": csrf, "label": "team b", "api_key": pasted})
    assert answer.status_code == 422
    assert 'value="team b"' in answer.text
    assert "May not hold control characters" in answer.text
    assert "newline-000000000000" not in answer.text


async def test_a_refused_key_shows_why_and_the_strategy_is_chosen_on_the_page(
    client: httpx.AsyncClient,
    ctx: Context,
    project_id: str,
) -> None:
    SWEEP.register(SECOND)
    csrf = await signed_in_csrf(client)
    _, second = await key_pools.add_key(ctx, project_id=project_id, provider="openai", api_key=SECOND, actor="t")
    first = (await integrations.get_integration(ctx, project_id=project_id, provider="openai")).keys[0]
    await key_pools.take_key_out_of_service(
        ctx, project_id=project_id, provider="openai", key_id=first.id, failure="refused by the provider (401)"
    )
    page = await client.get(page_of(project_id))
    assert "out of service refused by the provider (401)" in key_rows(page.text)[0]
    assert ">Enable</button>" in page.text

    saved = await client.post(f"{page_of(project_id)}/strategy", data={"csrf": csrf, "key_strategy": "spread"})
    assert saved.status_code == 303
    found = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert found.key_strategy == "spread"
    refused = await client.post(f"{page_of(project_id)}/strategy", data={"csrf": csrf, "key_strategy": "random"})
    assert refused.status_code == 422
    assert "Choose failover or spread." in refused.text
    assert second.id  # the second key stays in service: the last one is never taken out


@pytest.mark.parametrize("path", ["", "/strategy"])
async def test_the_pool_forms_need_the_session_csrf_token(
    client: httpx.AsyncClient,
    project_id: str,
    path: str,
) -> None:
    await signed_in_csrf(client)
    answer = await client.post(page_of(project_id) + path, data={"label": "x", "api_key": SECOND})
    assert answer.status_code == 403
