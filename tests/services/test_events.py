"""Events in the database, on SQLite and PostgreSQL: a due delivery is posted by one process only, however many
try at once; webhook secrets survive a master-key rotation and are never stored in plaintext."""

import asyncio

from credgate.config import Settings
from credgate.services import audit, events, integrations, key_pools, projects
from credgate.services.context import Context
from credgate.services.master_keys import rotate_master_key
from tests.secret_sweep import SWEEP
from tests.services.helpers import DatabaseFixture, opened


class Receiver:
    """A poster that records what it was given and answers 200 after a pause (a slow receiver)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, bytes, dict[str, str]]] = []

    async def __call__(self, url: str, body: bytes, headers: list[tuple[str, str]]) -> int:
        self.posts.append((url, body, dict(headers)))
        await asyncio.sleep(0.05)
        return 200


async def test_a_due_delivery_is_posted_once_however_many_processes_try_at_once(
    ctx: Context, settings: Settings, database: DatabaseFixture
) -> None:
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    webhook, secret = await events.add_webhook(ctx, project_id=project.id, url="https://hooks.test/x", actor="t")
    SWEEP.register(secret)
    for _ in range(5):
        await events.send_test_event(ctx, project_id=project.id, webhook_id=webhook.id, actor="t")
    receiver = Receiver()
    async with opened(settings, database) as second, opened(settings, database) as third:
        attempted = await asyncio.gather(*(events.deliver_due(each, receiver) for each in (ctx, second, third)))
        attempted += await asyncio.gather(*(events.deliver_due(each, receiver) for each in (ctx, second, third)))
    assert sum(attempted) == 5
    assert len({body for _, body, _ in receiver.posts}) == 5
    delivered = await events.list_deliveries(ctx, project_id=project.id)
    assert {(each.status, each.attempts) for each in delivered} == {("delivered", 1)}
    for _, body, headers in receiver.posts:
        at = int(headers["Credgate-Signature"].split(",")[0].removeprefix("t="))
        assert headers["Credgate-Signature"] == events.sign(secret, body, at=at)


async def test_a_webhook_secret_is_sealed_and_signs_the_same_after_a_master_key_rotation(
    ctx: Context, settings: Settings
) -> None:
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    webhook, secret = await events.add_webhook(ctx, project_id=project.id, url="https://hooks.test/x", actor="t")
    SWEEP.register(secret)
    async with ctx.database.transaction(write=False) as repo:
        stored = await repo.get_webhook(project.id, webhook.id)
        assert stored is not None
        assert secret.encode() not in stored.secret_ciphertext
        before = stored.master_key_id

    await rotate_master_key(ctx, settings, actor="t")
    await events.send_test_event(ctx, project_id=project.id, webhook_id=webhook.id, actor="t")
    receiver = Receiver()
    assert await events.deliver_due(ctx, receiver) == 1

    [(_, body, headers)] = receiver.posts
    at = int(headers["Credgate-Signature"].split(",")[0].removeprefix("t="))
    assert headers["Credgate-Signature"] == events.sign(secret, body, at=at)
    async with ctx.database.transaction(write=False) as repo:
        assert (await repo.get_webhook(project.id, webhook.id)).master_key_id != before  # type: ignore[union-attr]


async def test_a_disabled_webhook_gets_no_event_but_a_test_and_its_pending_deliveries_fail_saying_why(
    ctx: Context,
) -> None:
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    webhook, secret = await events.add_webhook(ctx, project_id=project.id, url="https://hooks.test/x", actor="t")
    SWEEP.register(secret)
    async with ctx.database.transaction() as repo:  # an event for it while it is enabled
        await events.emit(ctx, repo, project_id=project.id, type="provider_key.age", data={})
    await events.update_webhook(ctx, project_id=project.id, webhook_id=webhook.id, enabled=False, actor="t")
    async with ctx.database.transaction() as repo:  # and one after: it gets no delivery at all
        await events.emit(ctx, repo, project_id=project.id, type="provider_key.age", data={})
    await events.send_test_event(ctx, project_id=project.id, webhook_id=webhook.id, actor="t")
    receiver = Receiver()

    assert await events.deliver_due(ctx, receiver) == 1

    assert [headers["Credgate-Event-Type"] for _, _, headers in receiver.posts] == ["webhook.test"]
    deliveries = await events.list_deliveries(ctx, project_id=project.id)
    found = {(each.event.type, each.status, each.last_error) for each in deliveries}
    assert found == {("webhook.test", "delivered", None), ("provider_key.age", "failed", "the webhook is disabled")}


async def test_the_scan_announces_a_current_token_expiring_not_one_retired_into_its_grace(ctx: Context) -> None:
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    await projects.rotate_project_token(ctx, project_id=project.id, grace_seconds=3600, actor="t")
    assert (await events.scan(ctx)).expiring_tokens == 0  # the old token ends within the hour, on purpose
    await projects.rotate_project_token(ctx, project_id=project.id, expires_in_seconds=86400, actor="t")
    assert (await events.scan(ctx)).expiring_tokens == 1


async def test_a_promoted_keys_predecessor_is_kept_past_its_overlap_while_it_is_the_only_key_in_service(
    ctx: Context,
) -> None:
    first, second = "sk-test-retire-first-000000001", "sk-test-retire-second-00000002"
    for key in (first, second):
        SWEEP.register(key)
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    await integrations.add_custom_integration(
        ctx, project_id=project.id, provider="acme", base_url="https://api.acme.test", api_key=first, actor="t"
    )
    _, added = await key_pools.add_key(ctx, project_id=project.id, provider="acme", api_key=second, actor="t")
    await key_pools.promote_key(
        ctx, project_id=project.id, provider="acme", key_id=added.id, retire_previous_after_seconds=0, actor="t"
    )
    await key_pools.update_key(ctx, project_id=project.id, provider="acme", key_id=added.id, disabled=True, actor="t")

    assert (await events.scan(ctx)).retired_keys == 0  # the predecessor is all the pool has left in service
    audited = [event.action for event in await audit.list_audit_events(ctx, limit=1, project_id=project.id)]
    assert audited == ["provider_key.update"]  # an abandoned retirement leaves no trace
    await key_pools.update_key(ctx, project_id=project.id, provider="acme", key_id=added.id, disabled=False, actor="t")
    assert (await events.scan(ctx)).retired_keys == 1
    pool = await integrations.get_integration(ctx, project_id=project.id, provider="acme")
    assert [key.id for key in pool.keys] == [added.id]
