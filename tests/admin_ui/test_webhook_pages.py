"""The panel's webhooks and the rotation flow: a webhook added with its secret shown once (the form kept when
refused), tested, disabled, removed after a confirmation, its deliveries listed; a key promoted with an overlap,
a key older than the project's policy flagged."""

import re
from datetime import timedelta

import httpx

from credgate.services import events, integrations, key_pools, projects
from credgate.services.context import Context
from tests.admin_ui.conftest import KEY
from tests.admin_ui.test_security import signed_in_csrf
from tests.secret_sweep import SWEEP

SECOND = "sk-test-panel-promoted-key-0wxyz"
RECEIVER = "https://hooks.example.test/credgate"


async def test_a_webhook_is_added_with_its_secret_shown_once_then_tested_disabled_and_removed(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}/webhooks"
    form = {"csrf": csrf, "url": RECEIVER, "events": ["budget.threshold", "provider_key.age"]}
    added = await client.post(page, data=form, follow_redirects=True)
    assert "Webhook added" in added.text
    shown = re.search(r"(whsec_[A-Za-z0-9_-]+)", added.text)
    assert shown is not None
    # Shown once by design (not a stored secret for the sweep); the next page must not show it.
    assert "signing secret, shown this once" in added.text
    assert shown.group(1) not in (await client.get(page)).text  # once
    [webhook] = await events.list_webhooks(ctx, project_id=project_id)
    assert webhook.events == ["budget.threshold", "provider_key.age"]

    tested = await client.post(f"{page}/{webhook.id}", data={"csrf": csrf, "action": "test"}, follow_redirects=True)
    assert "Test event queued" in tested.text
    assert "<code>webhook.test</code>" in tested.text  # in the delivery log, pending
    await client.post(f"{page}/{webhook.id}", data={"csrf": csrf, "action": "disable"})
    assert not (await events.list_webhooks(ctx, project_id=project_id))[0].enabled

    assert "Remove this webhook?" in (await client.get(f"{page}/{webhook.id}/remove")).text
    removed = await client.post(f"{page}/{webhook.id}/remove", data={"csrf": csrf}, follow_redirects=True)
    assert "No webhook: events are kept, and posted to none." in removed.text


async def test_a_refused_webhook_keeps_what_was_typed(client: httpx.AsyncClient, ctx: Context, project_id: str) -> None:
    csrf = await signed_in_csrf(client)
    form = {"csrf": csrf, "url": "ftp://hooks.example.test/x", "events": ["provider_key.age"]}
    refused = await client.post(f"/admin/projects/{project_id}/webhooks", data=form)
    assert refused.status_code == 422
    assert 'value="ftp://hooks.example.test/x"' in refused.text
    assert 'value="provider_key.age" checked' in refused.text
    assert await events.list_webhooks(ctx, project_id=project_id) == []


async def test_a_key_is_promoted_with_an_overlap_and_an_old_key_is_flagged(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    SWEEP.register(SECOND)
    csrf = await signed_in_csrf(client)
    await key_pools.add_key(ctx, project_id=project_id, provider="openai", api_key=SECOND, actor="t")
    pool = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    first_id, second_id = pool.keys[0].id, pool.keys[1].id
    page = f"/admin/projects/{project_id}/integrations/openai/keys"

    promoted = await client.post(
        f"{page}/{second_id}", data={"csrf": csrf, "action": "promote", "overlap": "86400"}, follow_redirects=True
    )
    assert "Key promoted: it serves first now; the previous first key is removed after 1 day." in promoted.text
    found = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert [key.id for key in found.keys] == [second_id, first_id]
    assert found.keys[1].retire_at is not None
    assert "removed at " in promoted.text

    changes = projects.ProjectChanges(key_max_age_days=30)
    await projects.update_project(ctx, project_id=project_id, changes=changes, actor="t")
    async with ctx.database.transaction() as repo:  # both secrets set 31 days ago
        aged_pool = await repo.get_integration(project_id, "openai")
        assert aged_pool is not None
        for key in aged_pool.keys:
            key.sealed_at = ctx.clock() - timedelta(days=31)
    aged = await client.get(page)
    assert aged.text.count("older than the policy (30 days)") == 2
    for answer in (promoted, aged):
        assert SECOND not in answer.text
        assert KEY not in answer.text


async def test_the_key_age_policy_is_set_in_the_project_settings(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    form = {"csrf": csrf, "name": "p", "rate_limit_per_minute": "", "key_max_age_days": "90"}
    saved = await client.post(f"/admin/projects/{project_id}", data=form, follow_redirects=True)
    assert "Project settings saved." in saved.text
    assert (await projects.get_project(ctx, project_id=project_id)).key_max_age_days == 90
    refused = await client.post(f"/admin/projects/{project_id}", data=form | {"key_max_age_days": "0"})
    assert refused.status_code == 422
    assert (await projects.get_project(ctx, project_id=project_id)).key_max_age_days == 90
