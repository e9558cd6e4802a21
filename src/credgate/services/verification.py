"""Verification of a provider key on save: a cheap call (the admin's, or a template's `verify`) that says whether
the provider accepts the key. The call itself is made by the data plane, which implements `KeyVerifier`."""

from dataclasses import dataclass, replace
from typing import Protocol

from credgate.paths import rebase_path
from credgate.resolved import ResolvedIntegration
from credgate.services.access import resolved_integration
from credgate.services.context import Context
from credgate.services.integrations import get_integration
from credgate.services.key_pools import find_key
from credgate.services.provider_keys import open_pool_key
from credgate.specs import Endpoint
from credgate.storage.models import Integration

NO_CALL = "no verification call is known for this integration: name one as its verify_call"


@dataclass(frozen=True, slots=True)
class Verification:
    accepted: bool | None  # None: nothing could tell (no verification call, or the provider did not answer)
    status: int | None
    message: str


class KeyVerifier(Protocol):
    async def __call__(self, *, project_id: str, integration: ResolvedIntegration, call: Endpoint) -> Verification:
        """Make `call` with the integration's key and say whether the provider accepted it."""
        ...


def verdict(status: int) -> Verification:
    if 200 <= status < 300:
        return Verification(accepted=True, status=status, message="the provider accepted the key")
    if status in (401, 403):
        return Verification(accepted=False, status=status, message="the provider refused the key")
    return Verification(accepted=None, status=status, message=f"the provider answered {status}: nothing to tell")


def verification_call(ctx: Context, integration: Integration) -> Endpoint | None:
    """The cheap call that tells whether the provider takes a key: the admin's own (`verify_call`), else its
    templates' call. None when neither names one."""
    if integration.verify_call is not None:
        return Endpoint.model_validate(integration.verify_call)
    return template_call(ctx, integration)


def template_call(ctx: Context, integration: Integration) -> Endpoint | None:
    """The first `verify` of the integration's templates, at its base URL (a custom integration has none)."""
    for template_id in integration.templates:
        template = ctx.templates.get(template_id)
        if template is not None and template.verify is not None:
            path = rebase_path(template.verify.path, from_base=template.base_url, to_base=integration.base_url)
            return Endpoint(method=template.verify.method, path=path)
    return None


async def verify_provider_key(
    ctx: Context, verifier: KeyVerifier, *, project_id: str, provider: str, key_id: str | None = None
) -> Verification:
    """Ask the provider whether it accepts the integration's key (the first in service, or the pool's key
    `key_id` whatever its state), with a verification call of its templates."""
    integration = await get_integration(ctx, project_id=project_id, provider=provider)
    chosen = None if key_id is None else find_key(integration, key_id)
    call = verification_call(ctx, integration)
    if call is None:
        return Verification(accepted=None, status=None, message=NO_CALL)
    resolved = resolved_integration(ctx, integration)
    if chosen is not None:
        resolved = replace(resolved, credential=open_pool_key(ctx.keyring, integration, chosen))
    if resolved.credential is None:
        return Verification(accepted=False, status=None, message="the key is revoked")
    return await verifier(project_id=project_id, integration=resolved, call=call)
