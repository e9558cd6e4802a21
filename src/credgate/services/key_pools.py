"""Key pools: several provider keys per integration, each with a stable id, in the order failover follows.

Every change is audited and reaches every worker and instance like any other. The provider's refusal of a key
(401, 403) takes it out of service (`take_key_out_of_service`, by the proxy) until an admin puts it back, sets a
new secret on it, or removes it.
"""

from datetime import timedelta
from typing import Literal

from credgate.errors import Conflict, InvalidInput, NotFound
from credgate.limits import MAX_KEY_LABEL_LENGTH, MAX_KEYS_PER_INTEGRATION
from credgate.services.context import Context
from credgate.services.events import emit
from credgate.services.integrations import require_integration
from credgate.services.provider_keys import add_pool_key, clean_api_key
from credgate.storage.models import Integration, ProviderKey

PROVIDER_ACTOR = "credgate:provider-refusal"  # the audit's actor when the provider's answer took a key out
MAX_OVERLAP = timedelta(days=30)  # how long a promoted key's predecessor may stay, at most


def key_state(key: ProviderKey) -> Literal["active", "disabled", "failed", "revoked"]:
    """A key as the API shows it: revoked (no secret), disabled (by an admin), failed (refused by the provider),
    else active."""
    if key.ciphertext is None:
        return "revoked"
    if key.disabled:
        return "disabled"
    return "failed" if key.failed_at is not None else "active"


def _label(label: str) -> str:
    label = label.strip()
    if len(label) > MAX_KEY_LABEL_LENGTH:
        raise InvalidInput("label", f"must be at most {MAX_KEY_LABEL_LENGTH} characters")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in label):
        raise InvalidInput("label", "may not hold control characters")
    return label


def find_key(integration: Integration, key_id: str) -> ProviderKey:
    for key in integration.keys:
        if key.id == key_id:
            return key
    raise NotFound(f"integration {integration.provider} has no key {key_id}")


async def add_key(
    ctx: Context, *, project_id: str, provider: str, api_key: str, label: str = "", actor: str
) -> tuple[Integration, ProviderKey]:
    """A new key at the end of the pool, in service at once."""
    label = _label(label)
    async with ctx.change(actor=actor, action="provider_key.add", project_id=project_id, provider=provider) as repo:
        integration = await require_integration(repo, project_id, provider)
        if len(integration.keys) >= MAX_KEYS_PER_INTEGRATION:
            raise Conflict(f"integration {provider} already holds {MAX_KEYS_PER_INTEGRATION} keys, the most it may")
        cleaned = clean_api_key(api_key, auth_method=integration.auth["method"])
        key = add_pool_key(ctx.keyring, integration, cleaned, label=label, now=ctx.clock())
        integration.updated_at = ctx.clock()
    return integration, key


async def update_key(
    ctx: Context,
    *,
    project_id: str,
    provider: str,
    key_id: str,
    actor: str,
    label: str | None = None,
    disabled: bool | None = None,
    position: int | None = None,
) -> Integration:
    """Rename, disable or enable, or move a key (`position`: its place in the pool, 0 first). Enabling a key the
    provider refused puts it back in service: the admin's answer to the refusal."""
    async with ctx.change(actor=actor, action="provider_key.update", project_id=project_id, provider=provider) as repo:
        integration = await require_integration(repo, project_id, provider)
        key = find_key(integration, key_id)
        if label is not None:
            key.label = _label(label)
        if disabled is not None:
            key.disabled = disabled
            if not disabled:
                key.failed_at = key.failure = None
        if position is not None:
            if not 0 <= position < len(integration.keys):
                raise InvalidInput("position", f"must be from 0 to {len(integration.keys) - 1}")
            ordered = [other for other in integration.keys if other is not key]
            ordered.insert(position, key)
            for place, each in enumerate(ordered):
                each.position = place
            integration.keys.sort(key=lambda each: each.position)  # as the next load orders them
        key.updated_at = integration.updated_at = ctx.clock()
    return integration


async def remove_key(ctx: Context, *, project_id: str, provider: str, key_id: str, actor: str) -> Integration:
    """Remove a key from the pool; its secret goes with its row."""
    async with ctx.change(actor=actor, action="provider_key.remove", project_id=project_id, provider=provider) as repo:
        integration = await require_integration(repo, project_id, provider)
        integration.keys.remove(find_key(integration, key_id))
        integration.updated_at = ctx.clock()
    return integration


async def take_key_out_of_service(ctx: Context, *, project_id: str, provider: str, key_id: str, failure: str) -> None:
    """The provider refused the key: out of service for every worker and instance, until an admin acts. Never
    the pool's last key in service (workers refusing keys at once could otherwise empty a pool between them):
    that one's refusals reach the client as the provider sent them."""
    async with ctx.change(
        actor=PROVIDER_ACTOR, action="provider_key.out_of_service", project_id=project_id, provider=provider
    ) as repo:
        integration = await require_integration(repo, project_id, provider)
        key = find_key(integration, key_id)
        in_service = [each for each in integration.keys if key_state(each) == "active"]
        if key_state(key) == "active" and len(in_service) > 1:
            # Workers refusing the key at once each get here: the event is written once, for this secret.
            once = f"provider_key.out_of_service:{key.id}:{key.secret_since.isoformat()}:{key.updated_at.isoformat()}"
            key.failed_at = ctx.clock()
            key.failure = failure[:200]
            data = {
                "provider": provider,
                "key_id": key.id,
                "label": key.label,
                "hint": key.hint,
                "failure": key.failure,
            }
            await emit(ctx, repo, project_id=project_id, type="provider_key.out_of_service", data=data, once_key=once)


async def promote_key(
    ctx: Context, *, project_id: str, provider: str, key_id: str, retire_previous_after_seconds: int | None, actor: str
) -> Integration:
    """Put a (verified) key first and in service; the key that was first stays second for the overlap, then is
    removed (`retire_previous_after_seconds`; None keeps it)."""
    if (
        retire_previous_after_seconds is not None
        and not 0 <= retire_previous_after_seconds <= MAX_OVERLAP.total_seconds()
    ):
        raise InvalidInput("retire_previous_after_seconds", f"must be from 0 to {int(MAX_OVERLAP.total_seconds())}")
    async with ctx.change(actor=actor, action="provider_key.promote", project_id=project_id, provider=provider) as repo:
        integration = await require_integration(repo, project_id, provider)
        key = find_key(integration, key_id)
        if key.ciphertext is None:
            raise Conflict("a revoked key cannot be promoted: set a new secret on it first")
        previous = integration.keys[0]
        ordered = [key, *(other for other in integration.keys if other is not key)]
        for place, each in enumerate(ordered):
            each.position = place
        integration.keys.sort(key=lambda each: each.position)
        now = ctx.clock()
        key.disabled, key.failed_at, key.failure, key.retire_at = False, None, None, None
        if previous is not key and retire_previous_after_seconds is not None:
            previous.retire_at = now + timedelta(seconds=retire_previous_after_seconds)
        key.updated_at = previous.updated_at = integration.updated_at = now
    return integration
