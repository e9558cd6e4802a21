"""Events and their webhooks: what a project's admins want to hear of, posted as signed JSON, retried, logged.

An event is written in the transaction of what caused it (a key taken out of service), or by the scan that
notices it (a budget threshold crossed, a key older than its project's policy, a token about to expire, a key due
for retirement), once whichever worker or instance notices it first (`once_key`). Each webhook of the project that
takes its type gets a delivery: posted with `Credgate-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of
"<t>.<body>">` under the webhook's own secret, retried with backoff, every attempt logged. A payload names ids,
hints and numbers, never a secret.
"""

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from credgate import metrics
from credgate.crypto import DecryptionError, generate_token, secret_binding
from credgate.errors import InvalidInput, NotFound
from credgate.limits import ListLimit, within
from credgate.netguard import UpstreamRefused, check_upstream_url
from credgate.outages import Outage
from credgate.services.budgets import rule_of
from credgate.services.context import Context, new_id, plausible_id
from credgate.services.projects import require_project
from credgate.specs import BaseUrl
from credgate.storage import Repository
from credgate.storage.models import Event, EventDelivery, Webhook

logger = logging.getLogger(__name__)

EVENT_TYPES = {
    "budget.threshold": "a budget reached one of its thresholds (a percentage of its limit) in its period",
    "provider_key.out_of_service": "the provider refused a key of a pool (401, 403): it is out of service",
    "provider_key.age": "a key's secret is older than the project's key age policy",
    "provider_key.retired": "a key was removed at the end of its overlap after another was promoted",
    "project_token.expiring": "a project token expires within 7 days",
    "webhook.test": "a test event, sent on request to one webhook",
}
RETIREMENT_ACTOR = "credgate:retirement"  # the audit's actor when a key's overlap ended
WEBHOOK_SECRET_PREFIX = "whsec_"  # noqa: S105 - a public prefix, not a secret
SIGNATURE_HEADER = "Credgate-Signature"
MAX_WEBHOOKS_PER_PROJECT = 10
# After a failed attempt, the next one waits this long; after the last, the delivery has failed.
RETRY_DELAYS = (
    timedelta(seconds=10),
    timedelta(minutes=1),
    timedelta(minutes=5),
    timedelta(minutes=30),
    timedelta(hours=2),
    timedelta(hours=6),
)
LEASE = timedelta(minutes=2)  # a claimed delivery no other process sends meanwhile (it outlasts the post's timeout)
TOKEN_EXPIRY_NOTICE = timedelta(days=7)
_WEBHOOK_PURPOSE = "webhook_secret"

Poster = Callable[[str, bytes, list[tuple[str, str]]], Awaitable[int]]
"""Posts a body to a URL with headers; the receiver's status, or an exception when it could not be reached."""


def _binding(webhook: Webhook) -> bytes:
    return secret_binding(project_id=webhook.project_id, provider=webhook.id, purpose=_WEBHOOK_PURPOSE)


def sign(secret: str, body: bytes, *, at: int) -> str:
    """The signature header's value: the time, and the HMAC-SHA256 of "<time>.<body>" under the secret."""
    digest = hmac.new(secret.encode(), str(at).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={at},v1={digest}"


# emitting


async def emit(
    ctx: Context,
    repo: Repository,
    *,
    project_id: str,
    type: str,
    data: dict[str, Any],
    once_key: str | None = None,
    webhook: Webhook | None = None,
) -> Event | None:
    """Write an event and a delivery for each enabled webhook of the project that takes its type (only `webhook`,
    when given), in `repo`'s transaction; None when an event with `once_key` exists already."""
    now = ctx.clock()
    event_id = new_id("evt")
    body = {"id": event_id, "type": type, "created_at": now.isoformat(), "project_id": project_id, "data": data}
    event = Event(
        id=event_id,
        project_id=project_id,
        type=type,
        once_key=once_key,
        body=json.dumps(body, separators=(",", ":"), ensure_ascii=False),
        created_at=now,
    )
    if not await repo.add_event_once(event):
        return None
    # A test is for the webhook named, enabled or not; any other event for those enabled that take its type.
    listeners = [webhook] if webhook is not None else await repo.list_webhooks(project_id)
    for listener in listeners:
        if webhook is not None or (listener.enabled and (not listener.events or type in listener.events)):
            repo.add(
                EventDelivery(
                    event_id=event.id,
                    webhook_id=listener.id,
                    status="pending",
                    attempts=0,
                    next_attempt_at=now,
                    created_at=now,
                )
            )
    metrics.events_emitted.labels(type).inc()
    return event


# webhooks


def _events(events: Sequence[str]) -> list[str]:
    unknown = sorted(set(events) - set(EVENT_TYPES))
    if unknown:
        raise InvalidInput("events", f"unknown event type; the types are {', '.join(EVENT_TYPES)}")
    return sorted(set(events))


async def _url(ctx: Context, url: str) -> str:
    checked: str = within("url", BaseUrl, url)
    try:
        await check_upstream_url(checked, allow_private=ctx.allow_private_upstreams)
    except UpstreamRefused as error:
        raise InvalidInput("url", str(error)) from None
    return checked


async def require_webhook(repo: Repository, project_id: str, webhook_id: str) -> Webhook:
    await require_project(repo, project_id)
    webhook = await repo.get_webhook(project_id, webhook_id) if plausible_id(webhook_id) else None
    if webhook is None:
        raise NotFound("no such webhook")
    return webhook


async def add_webhook(
    ctx: Context, *, project_id: str, url: str, events: Sequence[str] = (), actor: str
) -> tuple[Webhook, str]:
    """A webhook for the project's events (`events`: the types it takes; none: all), and its signing secret,
    returned only here."""
    url, types = await _url(ctx, url), _events(events)
    secret = generate_token(WEBHOOK_SECRET_PREFIX)
    async with ctx.change(actor=actor, action="webhook.add", project_id=project_id) as repo:
        await require_project(repo, project_id)
        if len(await repo.list_webhooks(project_id)) >= MAX_WEBHOOKS_PER_PROJECT:
            raise InvalidInput("url", f"a project may have at most {MAX_WEBHOOKS_PER_PROJECT} webhooks")
        now = ctx.clock()
        webhook = Webhook(id=new_id("whk"), project_id=project_id, url=url, events=types, enabled=True)
        webhook.secret_ciphertext = ctx.keyring.seal(secret.encode(), aad=_binding(webhook))
        webhook.master_key_id = ctx.keyring.primary_key_id
        webhook.created_at = webhook.updated_at = now
        repo.add(webhook)
    return webhook, secret


async def list_webhooks(ctx: Context, *, project_id: str) -> Sequence[Webhook]:
    async with ctx.database.transaction(write=False) as repo:
        await require_project(repo, project_id)
        return await repo.list_webhooks(project_id)


async def update_webhook(
    ctx: Context,
    *,
    project_id: str,
    webhook_id: str,
    actor: str,
    url: str | None = None,
    events: Sequence[str] | None = None,
    enabled: bool | None = None,
) -> Webhook:
    checked_url = None if url is None else await _url(ctx, url)
    types = None if events is None else _events(events)
    async with ctx.change(actor=actor, action="webhook.update", project_id=project_id) as repo:
        webhook = await require_webhook(repo, project_id, webhook_id)
        if checked_url is not None:
            webhook.url = checked_url
        if types is not None:
            webhook.events = types
        if enabled is not None:
            webhook.enabled = enabled
        webhook.updated_at = ctx.clock()
    return webhook


async def remove_webhook(ctx: Context, *, project_id: str, webhook_id: str, actor: str) -> None:
    """Remove a webhook, its secret and its deliveries."""
    async with ctx.change(actor=actor, action="webhook.remove", project_id=project_id) as repo:
        await repo.delete(await require_webhook(repo, project_id, webhook_id))


async def send_test_event(ctx: Context, *, project_id: str, webhook_id: str, actor: str) -> Event:
    """A `webhook.test` event for this webhook alone, delivered like any other (within a second)."""
    async with ctx.change(actor=actor, action="webhook.test", project_id=project_id) as repo:
        webhook = await require_webhook(repo, project_id, webhook_id)
        data = {"webhook_id": webhook.id, "message": "a test event, sent on request"}
        event = await emit(ctx, repo, project_id=project_id, type="webhook.test", data=data, webhook=webhook)
    assert event is not None  # noqa: S101 - an event without a once_key is always written
    return event


async def list_deliveries(
    ctx: Context, *, project_id: str, webhook_id: str | None = None, limit: int = 100
) -> Sequence[EventDelivery]:
    """The delivery log, newest first: each event to each webhook, its state, attempts and last answer."""
    within("limit", ListLimit, limit)
    async with ctx.database.transaction(write=False) as repo:
        if webhook_id is not None:
            await require_webhook(repo, project_id, webhook_id)
        else:
            await require_project(repo, project_id)
        return await repo.list_deliveries(project_id, webhook_id=webhook_id, limit=limit)


async def reseal_webhook_secrets(ctx: Context, *, batch: int = 100) -> int:
    """Every webhook secret sealed again under the key ring's primary master key (master-key rotation)."""
    keyring, resealed = ctx.keyring, 0
    while True:
        keyring.refresh()
        async with ctx.database.transaction() as repo:
            found = await repo.webhooks_not_under(keyring.primary_key_id, limit=batch)
            for webhook in found:
                binding = _binding(webhook)
                webhook.secret_ciphertext = keyring.seal(
                    keyring.open(webhook.secret_ciphertext, aad=binding), aad=binding
                )
                webhook.master_key_id = keyring.primary_key_id
            resealed += len(found)
        if not found:
            return resealed


# delivering


async def deliver_due(ctx: Context, post: Poster, *, limit: int = 20) -> int:
    """Post the deliveries that are due, each leased first so that no other process posts it meanwhile; record
    each answer. Returns how many were attempted."""
    now = ctx.clock()
    # Asked first in a read-only transaction: with nothing due (nearly always), no write transaction is begun,
    # so the dispatcher never queues behind (or holds up) the request log's writes.
    async with ctx.database.transaction(write=False) as repo:
        if not await repo.has_due_deliveries(now=now):
            return 0
    async with ctx.database.transaction() as repo:
        due = await repo.claim_due_deliveries(now=now, lease_until=now + LEASE, limit=limit)
        work = []
        for delivery in due:
            webhook = await repo.get_webhook(delivery.event.project_id, delivery.webhook_id)
            if webhook is None:
                continue
            if not webhook.enabled and delivery.event.type != "webhook.test":
                _give_up(delivery, delivery.event, "the webhook is disabled")
                continue
            try:
                secret = ctx.keyring.open(webhook.secret_ciphertext, aad=_binding(webhook)).decode()
            except DecryptionError:  # its master key is gone: this delivery fails, not every other one
                _give_up(delivery, delivery.event, "the webhook's secret cannot be opened")
                continue
            work.append((delivery.id, delivery.event, webhook.url, secret))
    results = await asyncio.gather(*(_post(post, event, url, secret) for _, event, url, secret in work))
    if work:
        async with ctx.database.transaction() as repo:
            for (delivery_id, event, _, _), (status, error) in zip(work, results, strict=True):
                if (claimed := await repo.get_delivery(delivery_id)) is not None:
                    _record(ctx, claimed, event, status, error)
    return len(work)


async def _post(post: Poster, event: Event, url: str, secret: str) -> tuple[int | None, str | None]:
    body = event.body.encode()
    headers = [
        ("Content-Type", "application/json"),
        ("Credgate-Event-Id", event.id),
        ("Credgate-Event-Type", event.type),
        (SIGNATURE_HEADER, sign(secret, body, at=int(time.time()))),
    ]
    try:
        return await post(url, body, headers), None
    except Exception as error:  # the receiver's failure, whatever it is, is the delivery's, not the dispatcher's
        return None, str(error)[:200] or type(error).__name__


def _record(ctx: Context, delivery: EventDelivery, event: Event, status: int | None, error: str | None) -> None:
    now = ctx.clock()
    delivery.attempts += 1
    delivery.last_status = status
    if status is not None and 200 <= status < 300:
        delivery.status, delivery.delivered_at, delivery.next_attempt_at, delivery.last_error = (
            "delivered",
            now,
            None,
            None,
        )
        metrics.event_deliveries.labels("delivered").inc()
        return
    delivery.last_error = error or f"the receiver answered {status}"
    if delivery.attempts > len(RETRY_DELAYS):
        delivery.status, delivery.next_attempt_at = "failed", None
        metrics.event_deliveries.labels("failed").inc()
        logger.warning(
            "event %s (%s) could not be delivered: gave up after %d attempts", event.id, event.type, delivery.attempts
        )
        return
    delivery.next_attempt_at = now + RETRY_DELAYS[delivery.attempts - 1]
    metrics.event_deliveries.labels("retried").inc()


def _give_up(delivery: EventDelivery, event: Event, why: str, *, keep_error: bool = False) -> None:
    delivery.status, delivery.next_attempt_at = "failed", None
    if not keep_error:
        delivery.last_error = why
    metrics.event_deliveries.labels("failed").inc()
    logger.warning("event %s (%s) undelivered: %s", event.id, event.type, why)


# noticing


@dataclass(frozen=True, slots=True)
class ScanReport:
    """What one scan raised."""

    thresholds: int = 0
    aged_keys: int = 0
    expiring_tokens: int = 0
    retired_keys: int = 0


@dataclass(frozen=True, slots=True)
class _Noticed:
    """An event the scan found due, not yet written."""

    project_id: str
    type: str
    data: dict[str, Any]
    once_key: str


async def scan(ctx: Context) -> ScanReport:
    """Notice what no request announces: budget thresholds crossed, keys older than their project's policy, tokens
    about to expire, keys whose overlap ended (removed, audited). Each becomes an event once, whoever noticed.

    It reads in a read-only transaction; only what is new is written, each event in a short transaction of its own
    (so that a scan never holds SQLite's writer while it sums the request log)."""
    now = ctx.clock()
    async with ctx.database.transaction(write=False) as repo:
        noticed = [
            *await _thresholds_crossed(repo, now),
            *await _keys_come_of_age(repo, now),
            *await _tokens_expiring(repo, now),
        ]
        written = await repo.existing_once_keys([each.once_key for each in noticed])
    raised: dict[str, int] = {}
    for each in noticed:
        if each.once_key in written:
            continue
        async with ctx.database.transaction() as repo:
            event = await emit(
                ctx, repo, project_id=each.project_id, type=each.type, data=each.data, once_key=each.once_key
            )
        raised[each.type] = raised.get(each.type, 0) + (event is not None)
    return ScanReport(
        thresholds=raised.get("budget.threshold", 0),
        aged_keys=raised.get("provider_key.age", 0),
        expiring_tokens=raised.get("project_token.expiring", 0),
        retired_keys=await _retire_keys(ctx, now),
    )


async def _thresholds_crossed(repo: Repository, now: datetime) -> list[_Noticed]:
    noticed = []
    for budget in await repo.list_all_budgets():
        if budget.per_subject:
            continue  # an end user's spend is not the project's: no event per user (they would flood a receiver)
        start = rule_of(budget).window(now)[0]
        spent = await repo.spent(budget.project_id, metric=budget.metric, provider=budget.provider, since=start)
        for percent in sorted(budget.thresholds):
            if spent * 100 < percent * budget.amount:
                break
            data = {
                "budget_id": budget.id,
                "metric": budget.metric,
                "period": budget.period,
                "period_start": start.isoformat(),
                "provider": budget.provider,
                "threshold_percent": percent,
                "limit": budget.amount,
                "spent": spent,
                "unit": "micro-dollars" if budget.metric == "cost" else budget.metric,
            }
            # Once per period, threshold and limit: a raised limit can be crossed again.
            once = f"budget.threshold:{budget.id}:{budget.period}:{start:%Y-%m-%d}:{percent}:{budget.amount}"
            noticed.append(_Noticed(budget.project_id, "budget.threshold", data, once))
    return noticed


async def _keys_come_of_age(repo: Repository, now: datetime) -> list[_Noticed]:
    noticed = []
    for key, integration, policy_days in await repo.keys_under_age_policy():
        age = now - key.secret_since
        if age < timedelta(days=policy_days):
            continue
        data = {
            "provider": integration.provider,
            "key_id": key.id,
            "label": key.label,
            "hint": key.hint,
            "secret_set_at": key.secret_since.isoformat(),
            "age_days": age.days,
            "policy_days": policy_days,
        }
        once = f"provider_key.age:{key.id}:{key.secret_since.isoformat()}:{policy_days}"  # a new secret is young
        noticed.append(_Noticed(integration.project_id, "provider_key.age", data, once))
    metrics.keys_over_age.set(len(noticed))
    return noticed


async def _tokens_expiring(repo: Repository, now: datetime) -> list[_Noticed]:
    noticed = []
    for token in await repo.tokens_expiring(after=now, before=now + TOKEN_EXPIRY_NOTICE):
        expires_at = token.expires_at.isoformat() if token.expires_at else None
        data = {"token_prefix": token.prefix, "expires_at": expires_at}
        noticed.append(_Noticed(token.project_id, "project_token.expiring", data, f"project_token.expiring:{token.id}"))
    return noticed


class _NotDue(Exception):
    """The key was retired elsewhere meanwhile, or must not be: the change is abandoned (nothing audited)."""


async def _retire_keys(ctx: Context, now: datetime) -> int:
    """Remove the keys whose overlap has ended, each in a change of its own (audited, announced to the fleet).
    A key is kept, and tried again next scan, while it is the pool's only key in service."""
    async with ctx.database.transaction(write=False) as repo:
        found = await repo.keys_to_retire(now=now)
        due = [(key.id, key.integration.project_id, key.integration.provider) for key in found]
    retired = 0
    for key_id, project_id, provider in due:
        try:
            async with ctx.change(
                actor=RETIREMENT_ACTOR, action="provider_key.retire", project_id=project_id, provider=provider
            ) as repo:
                integration = await repo.get_integration(project_id, provider)
                key = next((each for each in integration.keys if each.id == key_id), None) if integration else None
                if integration is None or key is None or key.retire_at is None or key.retire_at > now:
                    raise _NotDue
                others_in_service = [
                    each
                    for each in integration.keys
                    if each is not key and each.ciphertext is not None and not each.disabled and each.failed_at is None
                ]
                if not others_in_service:
                    raise _NotDue
                integration.keys.remove(key)
                data = {"provider": provider, "key_id": key.id, "label": key.label, "hint": key.hint}
                once = f"provider_key.retired:{key.id}"
                await emit(ctx, repo, project_id=project_id, type="provider_key.retired", data=data, once_key=once)
        except _NotDue:
            continue
        retired += 1
    return retired


class EventDispatcher:
    """One process's share of the events work: due deliveries posted every `interval` seconds, the scan every
    `scan_interval`. Every process runs one; leases and `once_key`s keep the work from being done twice."""

    def __init__(self, ctx: Context, post: Poster, *, interval: float = 1.0, scan_interval: float = 15.0) -> None:
        self._ctx = ctx
        self._post = post
        self._interval = interval
        self._scan_interval = scan_interval
        self._outage = Outage(
            logger,
            down="the event dispatcher's work failed (%s): events wait until it succeeds (tried every second)",
            back="the event dispatcher works again",
        )

    async def run(self) -> None:
        """Until cancelled."""
        next_scan = time.monotonic()
        while True:
            try:
                if time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + self._scan_interval
                    await scan(self._ctx)
                while await deliver_due(self._ctx, self._post):
                    pass
            except Exception as error:  # the database away, say: logged once, tried again next turn
                self._outage.failed(error)
            else:
                self._outage.answered()
            await asyncio.sleep(self._interval)
