"""`credgate keys`: an integration's key, or its pool of keys."""

import click

from credgate.admin_api.schemas import IntegrationOut, PoolKeyOut, VerificationOut
from credgate.cli.base import actor, main, pass_settings, print_json, read_secret, run
from credgate.config import Settings
from credgate.limits import MAX_KEY_LABEL_LENGTH, MAX_KEYS_PER_INTEGRATION
from credgate.services import integrations, key_pools, verification
from credgate.services.bootstrap import open_context
from credgate.services.context import Context
from credgate.services.verification import Verification


@main.group("keys")
def keys_group() -> None:
    """Provider API keys: set (edit or rotate) and revoke."""


@keys_group.command("set")
@click.argument("project_id")
@click.argument("provider")
@click.option("--api-key-stdin", is_flag=True, required=True, help="Read the new key from standard input.")
@pass_settings
def keys_set(settings: Settings, project_id: str, provider: str, api_key_stdin: bool) -> None:
    """Edit or rotate a provider key; requests that start afterwards use the new one."""
    api_key = read_secret("API key")
    found = run(
        settings,
        lambda ctx: integrations.set_provider_key(
            ctx, project_id=project_id, provider=provider, api_key=api_key, actor=actor()
        ),
    )
    print_json(IntegrationOut.of(found))


@keys_group.command("revoke")
@click.argument("project_id")
@click.argument("provider")
@pass_settings
def keys_revoke(settings: Settings, project_id: str, provider: str) -> None:
    """Revoke a provider key: it is destroyed, and requests get 403 until a new key is set."""
    found = run(
        settings,
        lambda ctx: integrations.revoke_provider_key(ctx, project_id=project_id, provider=provider, actor=actor()),
    )
    print_json(IntegrationOut.of(found))


@keys_group.command("list")
@click.argument("project_id")
@click.argument("provider")
@pass_settings
def keys_list(settings: Settings, project_id: str, provider: str) -> None:
    """The integration's key pool, in order: ids, labels, hints and states, never a secret."""
    found = run(settings, lambda ctx: integrations.get_integration(ctx, project_id=project_id, provider=provider))
    print_json([PoolKeyOut.of(key) for key in found.keys])


@keys_group.command("add")
@click.argument("project_id")
@click.argument("provider")
@click.option("--api-key-stdin", is_flag=True, required=True, help="Read the key from standard input.")
@click.option("--label", default="", help=f"A name for the key (at most {MAX_KEY_LABEL_LENGTH} characters).")
@pass_settings
def keys_add(settings: Settings, project_id: str, provider: str, api_key_stdin: bool, label: str) -> None:
    """Add a key at the end of the integration's pool, in service at once."""
    api_key = read_secret("API key")
    _, key = run(
        settings,
        lambda ctx: key_pools.add_key(
            ctx, project_id=project_id, provider=provider, api_key=api_key, label=label, actor=actor()
        ),
    )
    print_json(PoolKeyOut.of(key))


@keys_group.command("update")
@click.argument("project_id")
@click.argument("provider")
@click.argument("key_id")
@click.option("--label", help="A new name for the key.")
@click.option("--disable/--enable", "disabled", default=None, help="Take it out of service, or put it back.")
@click.option(
    "--position", type=click.IntRange(0, MAX_KEYS_PER_INTEGRATION - 1), help="Its place in the pool, 0 first."
)
@pass_settings
def keys_update(
    settings: Settings,
    project_id: str,
    provider: str,
    key_id: str,
    label: str | None,
    disabled: bool | None,
    position: int | None,
) -> None:
    """Rename, disable or enable (also after the provider refused it), or move a key of the pool."""
    found = run(
        settings,
        lambda ctx: key_pools.update_key(
            ctx,
            project_id=project_id,
            provider=provider,
            key_id=key_id,
            actor=actor(),
            label=label,
            disabled=disabled,
            position=position,
        ),
    )
    print_json(IntegrationOut.of(found))


@keys_group.command("verify")
@click.argument("project_id")
@click.argument("provider")
@click.argument("key_id")
@pass_settings
def keys_verify(settings: Settings, project_id: str, provider: str, key_id: str) -> None:
    """Ask the provider, with the template's cheap call, whether it accepts a key of the pool (whatever its state:
    a new key can be checked before it is moved first)."""

    from credgate.runtime import Runtime  # the proxy, loaded for this command only

    async def work(ctx: Context) -> Verification:
        runtime = Runtime(settings, open_context, context=ctx)  # the proxy's own guarded, bounded call
        async with runtime.running():
            return await verification.verify_provider_key(
                ctx, runtime.verify_key, project_id=project_id, provider=provider, key_id=key_id
            )

    print_json(VerificationOut.of(run(settings, work)))


@keys_group.command("promote")
@click.argument("project_id")
@click.argument("provider")
@click.argument("key_id")
@click.option(
    "--retire-previous-after",
    "retire_after",
    type=click.IntRange(0, 30 * 86400),
    help="Remove the key that was first after this many seconds of overlap (default: keep it).",
)
@pass_settings
def keys_promote(settings: Settings, project_id: str, provider: str, key_id: str, retire_after: int | None) -> None:
    """Put a key first and in service (verify it first); its predecessor serves as the fallback until retired."""
    found = run(
        settings,
        lambda ctx: key_pools.promote_key(
            ctx,
            project_id=project_id,
            provider=provider,
            key_id=key_id,
            retire_previous_after_seconds=retire_after,
            actor=actor(),
        ),
    )
    print_json(IntegrationOut.of(found))


@keys_group.command("remove")
@click.argument("project_id")
@click.argument("provider")
@click.argument("key_id")
@pass_settings
def keys_remove(settings: Settings, project_id: str, provider: str, key_id: str) -> None:
    """Remove a key from the pool; its secret goes with it."""
    found = run(
        settings,
        lambda ctx: key_pools.remove_key(ctx, project_id=project_id, provider=provider, key_id=key_id, actor=actor()),
    )
    print_json(IntegrationOut.of(found))
