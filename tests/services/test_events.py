"""Events in the database, on SQLite and PostgreSQL: a due delivery is posted by one process only, however many
try at once; webhook secrets survive a master-key rotation and are never stored in plaintext."""

import asyncio

from credgate.config import Settings
from credgate.services import events, projects
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
