"""Events on real sockets: a running gateway posts each event to the project's webhooks, signed with HMAC-SHA256
over the exact body, retries a failing receiver with backoff and logs every delivery; the scan raises budget
thresholds, keys older than the policy, expiring tokens and timed retirements, once each; no payload holds a
secret."""

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from credgate.services import audit, budgets, events, integrations, key_pools, projects
from credgate.services.context import Context
from credgate.services.projects import ProjectChanges
from credgate.storage.models import EventDelivery
from tests.e2e.conftest import Project
from tests.e2e.test_budgets import chat, settled
from tests.e2e.test_key_pools import call, new_key, pool_of
from tests.secret_sweep import SWEEP
from tests.upstream import KeyJudge, WebhookReceiver, run_key_judge, run_webhook_receiver


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with run_webhook_receiver() as running:
        yield running


@pytest.fixture
async def provider() -> AsyncIterator[KeyJudge]:
    async with run_key_judge() as judge:
        yield judge


async def subscribe(ctx: Context, project: Project, receiver: WebhookReceiver, *types: str) -> str:
    """A webhook of the project to the receiver; its signing secret."""
    _, secret = await events.add_webhook(ctx, project_id=project.id, url=receiver.url, events=types, actor="t")
    SWEEP.register(secret)
    return secret


def verified(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """What a receiver does: recompute the signature over "<t>.<body>" and compare, within five minutes."""
    parts = dict(part.split("=", 1) for part in headers["Credgate-Signature"].split(","))
    expected = hmac.new(secret.encode(), parts["t"].encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts["v1"]) and abs(time.time() - int(parts["t"])) < 300


def assert_no_secret(receiver: WebhookReceiver, *secrets: str) -> None:
    for headers, body in receiver.received:
        for secret in secrets:
            assert secret not in body.decode()
            assert all(secret not in value for value in headers.values())


async def test_a_key_the_provider_refuses_is_announced_signed_with_its_id_and_hint_never_its_secret(
    gateway_url: str, ctx: Context, project: Project, provider: KeyJudge, receiver: WebhookReceiver
) -> None:
    secret = await subscribe(ctx, project, receiver, "provider_key.out_of_service")
    dead, spare = new_key("dead"), new_key("spare")
    provider.answers[dead] = (403, {})
    await pool_of(ctx, project, provider, dead, spare)

    assert (await call(gateway_url, project)).status_code == 200
    await receiver.wait_for(1)

    headers, body = receiver.received[0]
    assert verified(secret, headers, body)
    assert not verified(secret, headers, body + b" ")  # the signature covers the exact bytes
    event = json.loads(body)
    assert (headers["Credgate-Event-Type"], headers["Credgate-Event-Id"]) == (event["type"], event["id"])
    assert event["type"] == "provider_key.out_of_service"
    assert event["project_id"] == project.id
    found = await integrations.get_integration(ctx, project_id=project.id, provider="pool")
    assert event["data"] == {
        "provider": "pool",
        "key_id": found.keys[0].id,
        "label": "",
        "hint": "…" + dead[-4:],
        "failure": "refused by the provider (403)",
    }
    assert_no_secret(receiver, dead, spare, secret, project.token)
    delivery = await newest_settled(ctx, project)
    assert (delivery.status, delivery.attempts, delivery.last_status) == ("delivered", 1, 200)


async def test_a_failing_receiver_is_retried_with_backoff_until_it_answers_and_each_attempt_is_logged(
    gateway_url: str, ctx: Context, project: Project, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "RETRY_DELAYS", (timedelta(seconds=0.2), timedelta(seconds=0.4)))
    webhook, secret = await events.add_webhook(ctx, project_id=project.id, url=receiver.url, actor="t")
    SWEEP.register(secret)
    receiver.statuses = [500, 503]

    await events.send_test_event(ctx, project_id=project.id, webhook_id=webhook.id, actor="t")
    await receiver.wait_for(3)

    assert receiver.answered == [500, 503, 200]
    assert len({body for _, body in receiver.received}) == 1  # the same event, byte for byte
    assert all(verified(secret, headers, body) for headers, body in receiver.received)
    delivery = await newest_settled(ctx, project)
    assert (delivery.status, delivery.attempts, delivery.last_status, delivery.last_error) == (
        "delivered",
        3,
        200,
        None,
    )

    receiver.statuses = [500, 500, 500]  # never answers well: given up after the last retry
    await events.send_test_event(ctx, project_id=project.id, webhook_id=webhook.id, actor="t")
    await receiver.wait_for(6)
    newest = await newest_settled(ctx, project)
    assert (newest.status, newest.attempts, newest.last_error) == ("failed", 3, "the receiver answered 500")


async def newest_settled(ctx: Context, project: Project) -> EventDelivery:
    """The project's newest delivery once it is no longer pending (its last answer is recorded after the post)."""
    for _ in range(250):
        newest = (await events.list_deliveries(ctx, project_id=project.id))[0]
        if newest.status != "pending":
            return newest
        await asyncio.sleep(0.02)
    raise AssertionError("the delivery is still pending")


async def test_the_scan_raises_each_event_once_however_often_it_runs(
    gateway_url: str, ctx: Context, project: Project, receiver: WebhookReceiver
) -> None:
    await subscribe(ctx, project, receiver)
    await budgets.add_budget(
        ctx, project_id=project.id, metric="requests", limit=2, period="day", thresholds=[50, 100], actor="t"
    )
    changes = ProjectChanges(key_max_age_days=30)
    await projects.update_project(ctx, project_id=project.id, changes=changes, actor="t")
    _, token = await projects.rotate_project_token(ctx, project_id=project.id, actor="t", expires_in_seconds=3600)
    rotated = Project(project.id, token, project.key)
    assert [(await chat(gateway_url, rotated)).status_code for _ in range(2)] == [200, 200]
    await settled(ctx, project, 2)

    first = await events.scan(ctx)
    again = await events.scan(ctx)
    later = ctx.clock() + timedelta(days=31)
    ctx.clock = lambda: later  # the key's secret, set today, is 31 days old then
    aged = await events.scan(ctx)

    assert (first.thresholds, first.expiring_tokens, first.aged_keys) == (2, 1, 0)
    assert again == events.ScanReport()
    assert aged.aged_keys == 1
    await receiver.wait_for(4)
    kinds = sorted((event["type"], event["data"].get("threshold_percent")) for event in receiver.bodies())
    assert kinds == [
        ("budget.threshold", 50),
        ("budget.threshold", 100),
        ("project_token.expiring", None),
        ("provider_key.age", None),
    ]
    age = next(event["data"] for event in receiver.bodies() if event["type"] == "provider_key.age")
    assert (age["age_days"], age["policy_days"], age["provider"]) == (31, 30, "openai")
    assert_no_secret(receiver, project.key, project.token, token)


async def test_a_promoted_key_serves_at_once_and_the_old_one_is_removed_when_its_overlap_ends(
    gateway_url: str, ctx: Context, project: Project, provider: KeyJudge, receiver: WebhookReceiver
) -> None:
    await subscribe(ctx, project, receiver, "provider_key.retired")
    old, new = new_key("old"), new_key("new")
    await pool_of(ctx, project, provider, old, new)
    found = await integrations.get_integration(ctx, project_id=project.id, provider="pool")
    old_id, new_id = found.keys[0].id, found.keys[1].id

    promoted = await key_pools.promote_key(
        ctx, project_id=project.id, provider="pool", key_id=new_id, retire_previous_after_seconds=3600, actor="t"
    )
    assert [key.id for key in promoted.keys] == [new_id, old_id]
    assert promoted.keys[1].retire_at is not None
    assert (await call(gateway_url, project)).json()["key_hint"] == new[-4:]
    assert (await events.scan(ctx)).retired_keys == 0  # the overlap has not ended

    later = ctx.clock() + timedelta(hours=1, seconds=1)
    ctx.clock = lambda: later
    assert (await events.scan(ctx)).retired_keys == 1
    remaining = await integrations.get_integration(ctx, project_id=project.id, provider="pool")
    assert [key.id for key in remaining.keys] == [new_id]
    await receiver.wait_for(1)
    assert receiver.bodies()[0]["data"]["key_id"] == old_id
    actions = [event.action for event in await audit.list_audit_events(ctx, limit=3, project_id=project.id)]
    assert actions[0] == "provider_key.retire"
    assert_no_secret(receiver, old, new)
