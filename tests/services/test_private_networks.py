"""An integration's private_networks through the services, with the guard on: validated and normalised (422
naming the field), stored, carried to the proxy, checked with the URLs they allow, and audited with the list."""

from collections.abc import Sequence
from typing import Any

import pytest

from credgate.errors import Conflict, InvalidInput
from credgate.netguard import NO_PRIVATE_NETWORKS, PrivateNetworks
from credgate.services import audit, integrations, projects
from credgate.services.access import resolve_access
from credgate.services.context import Context
from credgate.services.integrations import PRIVATE_NETWORKS_ACTION, IntegrationChanges
from credgate.specs import OAuth2ClientCredentialsAuth
from credgate.storage.models import AuditEvent
from tests.secret_sweep import SWEEP

KEY = "sk-test-private-networks-0000wxyz"
SWEEP.register(KEY)
OLLAMA = "http://127.0.0.1:11434"
PUBLIC = "https://93.184.216.34/v1"


@pytest.fixture
async def guarded(ctx: Context) -> Context:
    ctx.allow_private_upstreams = False
    return ctx


@pytest.fixture
async def project(guarded: Context) -> tuple[str, str]:
    """A project's id and token."""
    project, token = await projects.create_project(guarded, name="self-hosted", actor="t")
    return project.id, token


async def add(ctx: Context, project_id: str, provider: str, base_url: str, networks: Sequence[str] | None) -> None:
    await integrations.add_custom_integration(
        ctx,
        project_id=project_id,
        provider=provider,
        base_url=base_url,
        api_key=KEY,
        private_networks=networks,
        actor="admin-token:ops",
    )


async def update(ctx: Context, project_id: str, provider: str = "ollama", **changes: Any) -> None:
    await integrations.update_integration(
        ctx, project_id=project_id, provider=provider, changes=IntegrationChanges(**changes), actor="admin-token:ops"
    )


async def exception_events(ctx: Context, project_id: str) -> list[AuditEvent]:
    events = await audit.list_audit_events(ctx, project_id=project_id)
    return [event for event in events if event.action == PRIVATE_NETWORKS_ACTION]


async def test_the_list_is_normalised_stored_and_carried_to_the_proxy(
    guarded: Context, project: tuple[str, str]
) -> None:
    project_id, token = project
    await add(guarded, project_id, "ollama", OLLAMA, ["127.0.0.1", "GPU-Box.", "fd00::1/8", "127.0.0.1/32"])
    stored = await integrations.get_integration(guarded, project_id=project_id, provider="ollama")
    assert stored.private_networks == ["127.0.0.1/32", "gpu-box", "fd00::/8"]
    access = await resolve_access(guarded, token=token, provider="ollama")
    assert access is not None
    assert access.integration is not None
    assert access.integration.private_networks == PrivateNetworks.of(["127.0.0.1", "gpu-box", "fd00::/8"])


async def test_without_the_list_the_guard_refuses_the_same_upstream_as_before(
    guarded: Context, project: tuple[str, str]
) -> None:
    project_id, token = project
    with pytest.raises(InvalidInput, match=r"^base_url: must use https \(set CREDGATE_ALLOW_PRIVATE_UPSTREAMS"):
        await add(guarded, project_id, "ollama", OLLAMA, None)
    with pytest.raises(InvalidInput, match=r"^base_url: reaches a loopback, .* \(set CREDGATE_ALLOW_PRIVATE_UPSTREAMS"):
        await add(guarded, project_id, "ollama", "https://127.0.0.1:11434", None)
    with pytest.raises(InvalidInput, match=r"^base_url: reaches a loopback, .* outside its private_networks"):
        await add(guarded, project_id, "ollama", OLLAMA, ["10.0.0.0/8"])  # a listed network opens only itself
    await add(guarded, project_id, "public", PUBLIC, [])
    access = await resolve_access(guarded, token=token, provider="public")
    assert access is not None
    assert access.integration is not None
    assert access.integration.private_networks == NO_PRIVATE_NETWORKS


@pytest.mark.parametrize(
    ("networks", "problem"),
    [
        (["169.254.169.254"], "private_networks: entry 1 may never include link-local"),
        (["10.0.0.0/8", "fe80::/10"], "private_networks: entry 2 may never include link-local"),
        (["fd00:ec2::254"], "private_networks: entry 1 may never include link-local"),
        (["metadata.google.internal"], "private_networks: entry 1 names a cloud metadata service"),
        (["not a host"], "private_networks: entry 1 is not a valid host name"),
        (["10.0.0.0/33"], "private_networks: entry 1 is not a valid IP network"),
        ([f"10.0.{index}.0/24" for index in range(33)], "private_networks: must be a list of at most 32 entries"),
    ],
)
async def test_an_invalid_list_is_a_422_naming_the_field_and_nothing_is_stored(
    guarded: Context, project: tuple[str, str], networks: list[str], problem: str
) -> None:
    project_id, _ = project
    with pytest.raises(InvalidInput) as refused:
        await add(guarded, project_id, "ollama", OLLAMA, networks)
    assert f"{refused.value.field}: {refused.value.problem}".startswith(problem)
    assert list(await integrations.list_integrations(guarded, project_id=project_id)) == []
    await add(guarded, project_id, "ollama", OLLAMA, ["127.0.0.1"])
    with pytest.raises(InvalidInput, match=r"^private_networks: "):
        await update(guarded, project_id, private_networks=networks)
    stored = await integrations.get_integration(guarded, project_id=project_id, provider="ollama")
    assert stored.private_networks == ["127.0.0.1/32"]


async def test_thirty_two_entries_are_allowed(guarded: Context, project: tuple[str, str]) -> None:
    project_id, _ = project
    networks = ["127.0.0.1", *(f"10.0.{index}.0/24" for index in range(31))]
    await add(guarded, project_id, "ollama", OLLAMA, networks)
    stored = await integrations.get_integration(guarded, project_id=project_id, provider="ollama")
    assert len(stored.private_networks) == 32


async def test_a_new_base_url_is_checked_within_the_new_list_or_else_the_stored_one(
    guarded: Context, project: tuple[str, str]
) -> None:
    project_id, _ = project
    await add(guarded, project_id, "ollama", OLLAMA, ["127.0.0.1", "10.0.0.0/8"])
    await update(guarded, project_id, base_url="http://10.1.2.3:8000/v1")  # inside the stored list
    with pytest.raises(InvalidInput, match=r"^base_url: "):
        await update(guarded, project_id, base_url="http://192.168.1.20:8000/v1")
    await update(guarded, project_id, base_url="http://192.168.1.20:8000/v1", private_networks=["192.168.1.20"])
    with pytest.raises(InvalidInput, match=r"^base_url: "):  # the new list, not the stored one
        await update(guarded, project_id, base_url="http://10.1.2.3:8000/v1", private_networks=["192.168.1.20"])
    stored = await integrations.get_integration(guarded, project_id=project_id, provider="ollama")
    assert (stored.base_url, stored.private_networks) == ("http://192.168.1.20:8000/v1", ["192.168.1.20/32"])


async def test_removing_the_exceptions_is_allowed_and_leaves_the_guard_in_full(
    guarded: Context, project: tuple[str, str]
) -> None:
    project_id, token = project
    await add(guarded, project_id, "ollama", OLLAMA, ["127.0.0.1"])
    await update(guarded, project_id, private_networks=[])
    access = await resolve_access(guarded, token=token, provider="ollama")
    assert access is not None
    assert access.integration is not None
    assert access.integration.private_networks == NO_PRIVATE_NETWORKS  # the proxy refuses the base URL again


async def test_an_oauth_token_url_is_checked_within_the_same_list(guarded: Context, project: tuple[str, str]) -> None:
    project_id, _ = project
    auth = OAuth2ClientCredentialsAuth(
        method="oauth2_client_credentials", token_url="http://127.0.0.1:9999/oauth/token", client_id="c"
    )
    with pytest.raises(InvalidInput, match=r"^auth.token_url: "):
        await integrations.add_custom_integration(
            guarded, project_id=project_id, provider="ollama", base_url=PUBLIC, api_key=KEY, auth=auth, actor="t"
        )
    await integrations.add_custom_integration(
        guarded,
        project_id=project_id,
        provider="ollama",
        base_url=PUBLIC,
        api_key=KEY,
        auth=auth,
        private_networks=["127.0.0.1"],
        actor="t",
    )


async def test_every_change_of_the_list_is_audited_with_the_new_list_and_nothing_else_is(
    guarded: Context, project: tuple[str, str]
) -> None:
    project_id, _ = project
    await add(guarded, project_id, "public", PUBLIC, None)
    assert await exception_events(guarded, project_id) == []  # no list, no entry
    await add(guarded, project_id, "ollama", OLLAMA, ["127.0.0.1", "Gpu-Box"])
    await update(guarded, project_id, private_networks=["gpu-box", "127.0.0.1"][::-1])  # the same list
    await update(guarded, project_id, timeout_seconds=30.0)
    await update(guarded, project_id, private_networks=["127.0.0.1", "10.0.0.0/8"])
    await update(guarded, project_id, private_networks=[])
    events = await exception_events(guarded, project_id)
    assert [event.detail for event in events] == [  # newest first
        {"private_networks": []},
        {"private_networks": ["127.0.0.1/32", "10.0.0.0/8"]},
        {"private_networks": ["127.0.0.1/32", "gpu-box"]},
    ]
    assert {(event.actor, event.project_id, event.provider) for event in events} == {
        ("admin-token:ops", project_id, "ollama")
    }
    actions = [event.action for event in await audit.list_audit_events(guarded, project_id=project_id)]
    assert actions.count("integration.update") == 4  # the general entry is kept beside the dedicated one


async def test_a_template_integration_takes_the_list_at_its_first_setup_only(
    guarded: Context, project: tuple[str, str]
) -> None:
    project_id, _ = project
    await integrations.add_template_integration(
        guarded,
        project_id=project_id,
        provider="local",
        template_id="openai-chat-completions",
        api_key=KEY,
        base_url=f"{OLLAMA}/v1",
        private_networks=["127.0.0.1"],
        actor="t",
    )
    with pytest.raises(Conflict, match="private_networks with PATCH"):
        await integrations.add_template_integration(
            guarded,
            project_id=project_id,
            provider="local",
            template_id="openai-image-generations",
            private_networks=["10.0.0.0/8"],
            actor="t",
        )
    await integrations.add_template_integration(  # the same list, or none: the template's endpoints are added
        guarded, project_id=project_id, provider="local", template_id="openai-image-generations", actor="t"
    )
    stored = await integrations.get_integration(guarded, project_id=project_id, provider="local")
    assert (stored.private_networks, len(stored.endpoints)) == (["127.0.0.1/32"], 2)
    assert [event.detail for event in await exception_events(guarded, project_id)] == [
        {"private_networks": ["127.0.0.1/32"]}
    ]
