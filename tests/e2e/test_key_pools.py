"""Key pools on real sockets: a request passes to the next key when the provider refuses one (401, 403) or has it
wait (429, 402), before any byte reached the client; a refused key is out of service until an admin acts."""

import asyncio
import json
import os
import secrets
import subprocess
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import REGISTRY

from credgate.config import Settings
from credgate.proxy.key_pools import FAILOVER_MAX_BODY_BYTES
from credgate.services import admins, audit, integrations, key_pools
from credgate.services.context import Context
from credgate.services.integrations import IntegrationChanges
from tests.admin_ui.test_security import PASSWORD, signed_in_csrf
from tests.e2e.conftest import CREDGATE, Project, add_custom
from tests.secret_sweep import SWEEP
from tests.upstream import KeyJudge, run_key_judge

PROVIDER = "pool"
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


def new_key(name: str) -> str:
    key = f"sk-{name}-" + secrets.token_urlsafe(12)
    SWEEP.register(key)
    return key


@pytest.fixture
async def provider() -> AsyncIterator[KeyJudge]:
    async with run_key_judge() as judge:
        yield judge


async def pool_of(ctx: Context, project: Project, provider: KeyJudge, *keys: str, strategy: str = "failover") -> None:
    """The project's `pool` integration, holding `keys` in that order."""
    await add_custom(ctx, project, PROVIDER, provider.url)
    await integrations.set_provider_key(ctx, project_id=project.id, provider=PROVIDER, api_key=keys[0], actor="t")
    for index, key in enumerate(keys[1:], 1):
        await key_pools.add_key(
            ctx, project_id=project.id, provider=PROVIDER, api_key=key, label=f"k{index}", actor="t"
        )
    if strategy != "failover":
        changes = IntegrationChanges(key_strategy=strategy)  # type: ignore[arg-type]
        await integrations.update_integration(ctx, project_id=project.id, provider=PROVIDER, changes=changes, actor="t")


async def call(gateway_url: str, project: Project, **options: object) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
        return await client.post(
            f"/proxy/{PROVIDER}/v1/chat/completions",
            headers={"authorization": f"Bearer {project.token}"},
            **({"json": CHAT} | options),  # type: ignore[arg-type]
        )


def failovers(reason: str) -> float:
    return REGISTRY.get_sample_value("credgate_key_failovers_total", {"provider": PROVIDER, "reason": reason}) or 0


async def test_a_key_told_to_wait_passes_the_request_to_the_next_which_is_used_until_it_has_rested(
    gateway_url: str, ctx: Context, project: Project, provider: KeyJudge
) -> None:
    waiting, spare = new_key("waiting"), new_key("spare")
    provider.answers[waiting] = (429, {"Retry-After": "120"})
    await pool_of(ctx, project, provider, waiting, spare)
    before = failovers("cooling")

    first = await call(gateway_url, project)
    second = await call(gateway_url, project)

    assert (first.status_code, second.status_code) == (200, 200)
    assert first.json()["key_hint"] == spare[-4:]
    assert provider.keys_called() == [waiting, spare, spare]  # resting: not asked again within its Retry-After
    assert provider.calls[0][1] == provider.calls[1][1]  # the same bytes, again
    assert json.loads(provider.calls[1][1]) == CHAT
    assert failovers("cooling") == before + 1


async def test_a_refused_key_is_out_of_service_shown_and_audited_until_an_admin_puts_it_back(
    gateway_url: str, ctx: Context, project: Project, provider: KeyJudge
) -> None:
    dead, spare = new_key("dead"), new_key("spare")
    provider.answers[dead] = (401, {})
    await pool_of(ctx, project, provider, dead, spare)

    assert (await call(gateway_url, project)).status_code == 200
    await key_pools_settled(ctx, project)
    found = await integrations.get_integration(ctx, project_id=project.id, provider=PROVIDER)
    states = [(key_pools.key_state(key), key.failure) for key in found.keys]
    assert states == [("failed", "refused by the provider (401)"), ("active", None)]
    events = await audit.list_audit_events(ctx, limit=5)
    assert any(event.action == "provider_key.out_of_service" for event in events)
    for _ in range(3):
        assert (await call(gateway_url, project)).status_code == 200
    assert provider.keys_called() == [dead, spare, spare, spare, spare]

    del provider.answers[dead]  # the admin fixed the account: enabling the key puts it back first in line
    await key_pools.update_key(
        ctx, project_id=project.id, provider=PROVIDER, key_id=found.keys[0].id, disabled=False, actor="t"
    )
    assert (await call(gateway_url, project)).json()["key_hint"] == dead[-4:]


async def key_pools_settled(ctx: Context, project: Project) -> None:
    """The proxy records a refusal in the background: wait for it to land."""
    for _ in range(100):
        found = await integrations.get_integration(ctx, project_id=project.id, provider=PROVIDER)
        if any(key.failed_at is not None for key in found.keys):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the refused key was never taken out of service")


async def test_the_last_keys_answer_is_relayed_as_is_and_with_every_key_resting_a_502_names_none(
    gateway_url: str, ctx: Context, project: Project, provider: KeyJudge
) -> None:
    first, last = new_key("first"), new_key("last")
    provider.answers[first] = (429, {"Retry-After": "60"})
    provider.answers[last] = (402, {})
    await pool_of(ctx, project, provider, first, last)

    relayed = await call(gateway_url, project)
    resting = await call(gateway_url, project)

    assert relayed.status_code == 402  # the provider's own answer, not wrapped
    assert "x-credgate-error" not in relayed.headers
    assert relayed.json() == {"error": {"message": "no"}}
    assert resting.status_code == 502
    assert resting.headers["x-credgate-error"] == "true"
    assert resting.json()["error"]["message"] == f"every key of {PROVIDER} is out of service or cooling down"
    found = await integrations.get_integration(ctx, project_id=project.id, provider=PROVIDER)
    for key in found.keys:
        assert key.id not in resting.text
    assert provider.keys_called() == [first, last]


@pytest.mark.parametrize("status", [500, 404, 400])
async def test_an_answer_that_is_not_about_the_key_is_relayed_and_the_next_key_never_asked(
    gateway_url: str, ctx: Context, project: Project, provider: KeyJudge, status: int
) -> None:
    first, second = new_key("first"), new_key("second")
    provider.answers[first] = (status, {})
    await pool_of(ctx, project, provider, first, second)
    assert (await call(gateway_url, project)).status_code == status
    assert provider.keys_called() == [first]


async def test_spread_takes_the_keys_in_turns(
    gateway_url: str, ctx: Context, project: Project, provider: KeyJudge
) -> None:
    one, two = new_key("one"), new_key("two")
    await pool_of(ctx, project, provider, one, two, strategy="spread")
    for _ in range(4):
        assert (await call(gateway_url, project)).status_code == 200
    assert provider.keys_called() == [one, two, one, two]


async def test_a_body_too_large_to_keep_gets_one_attempt(
    gateway_url: str, ctx: Context, project: Project, provider: KeyJudge
) -> None:
    waiting, spare = new_key("waiting"), new_key("spare")
    provider.answers[waiting] = (429, {})
    await pool_of(ctx, project, provider, waiting, spare)
    large = {**CHAT, "padding": "x" * (FAILOVER_MAX_BODY_BYTES + 1)}  # streamed through, not kept to send again

    answer = await call(gateway_url, project, json=large)
    assert answer.status_code == 429
    assert provider.keys_called() == [waiting]
    assert len(provider.calls[0][1]) > FAILOVER_MAX_BODY_BYTES


async def test_a_pool_of_one_relays_a_refusal_and_keeps_its_key(
    gateway_url: str, ctx: Context, project: Project, provider: KeyJudge
) -> None:
    only = new_key("only")
    provider.answers[only] = (401, {})
    await pool_of(ctx, project, provider, only)
    assert (await call(gateway_url, project)).status_code == 401
    del provider.answers[only]
    assert (await call(gateway_url, project)).status_code == 200  # never taken out: no key to take over
    found = await integrations.get_integration(ctx, project_id=project.id, provider=PROVIDER)
    assert [key_pools.key_state(key) for key in found.keys] == ["active"]


async def test_a_key_of_the_pool_is_verified_whatever_its_state_before_it_takes_over(
    gateway_url: str, ctx: Context, settings: Settings, project: Project, provider: KeyJudge
) -> None:
    """The rotation flow: add the new key disabled, verify it, move it first and enable it, remove the old one."""
    old, new = new_key("old"), new_key("new")
    await integrations.add_template_integration(
        ctx,
        project_id=project.id,
        provider="rotating",
        template_id="openai-chat-completions",
        api_key=old,
        base_url=f"{provider.url}/v1",
        actor="t",
    )
    _, staged = await key_pools.add_key(ctx, project_id=project.id, provider="rotating", api_key=new, actor="t")
    await key_pools.update_key(
        ctx, project_id=project.id, provider="rotating", key_id=staged.id, disabled=True, actor="t"
    )
    admin = {"authorization": f"Bearer {await admins.create_admin_token(ctx, name='v', actor='t')}"}
    keys = f"{gateway_url}/api/v1/projects/{project.id}/integrations/rotating/keys"
    provider.answers[new] = (401, {})  # not yet active at the provider
    async with httpx.AsyncClient(headers=admin, timeout=10) as api:
        refused = await api.post(f"{keys}/{staged.id}/verify")
        del provider.answers[new]
        accepted = await api.post(f"{keys}/{staged.id}/verify")
        unknown = await api.post(f"{keys}/key_nope/verify")
        promoted = await api.patch(f"{keys}/{staged.id}", json={"position": 0, "disabled": False})
    assert refused.json() == {"accepted": False, "status": 401, "message": "the provider refused the key"}
    assert accepted.json() == {"accepted": True, "status": 200, "message": "the provider accepted the key"}
    assert unknown.status_code == 404
    assert provider.calls[-1] == (new, b"")  # the template's cheap call, with the staged key
    assert promoted.json()["keys"][0]["id"] == staged.id
    assert provider.keys_called() == [new, new]

    # The same check from the CLI, which makes the call through the proxy's own guarded client.
    env = {
        **os.environ,
        "CREDGATE_DATA_DIR": str(settings.data_dir),
        "CREDGATE_DATABASE_URL": settings.resolved_database_url,
        "CREDGATE_ALLOW_PRIVATE_UPSTREAMS": "true",
    }
    old_id = next(
        key.id
        for key in (await integrations.get_integration(ctx, project_id=project.id, provider="rotating")).keys
        if key.id != staged.id
    )
    provider.answers[old] = (403, {})
    command = [CREDGATE, "keys", "verify", project.id, "rotating", old_id]
    result = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"accepted": False, "status": 403, "message": "the provider refused the key"}
    SWEEP.capture("cli keys verify", result.stdout + result.stderr)
    for answer in (refused, accepted, promoted):
        assert new not in answer.text
        assert old not in answer.text


async def test_the_panel_verifies_a_key_of_the_pool_through_the_running_gateway(
    gateway_url: str, ctx: Context, project: Project, provider: KeyJudge
) -> None:
    staged = new_key("staged")
    await integrations.add_template_integration(
        ctx,
        project_id=project.id,
        provider="rotating",
        template_id="openai-chat-completions",
        api_key=new_key("current"),
        base_url=f"{provider.url}/v1",
        actor="t",
    )
    _, key = await key_pools.add_key(ctx, project_id=project.id, provider="rotating", api_key=staged, actor="t")
    await admins.create_admin_user(ctx, username="admin", password=PASSWORD, actor="t")
    provider.answers[staged] = (401, {})
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as panel:
        csrf = await signed_in_csrf(panel)
        page = f"/admin/projects/{project.id}/integrations/rotating/keys"
        answer = await panel.post(f"{page}/{key.id}", data={"csrf": csrf, "action": "verify"}, follow_redirects=True)
    assert answer.status_code == 200
    assert "Verification: the provider refused the key (status 401)." in answer.text
    assert provider.calls[-1] == (staged, b"")
    assert staged not in answer.text
