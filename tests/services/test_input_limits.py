"""The services enforce every limit themselves, whatever the front end: a value out of range (or of the wrong
type) is InvalidInput naming the field, and nothing is changed or audited."""

from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from credgate.errors import InvalidInput, NotFound
from credgate.limits import MAX_GRACE, MAX_TOKEN_LIFETIME
from credgate.services import admins, audit, integrations, projects, usage
from credgate.services.access import resolve_access
from credgate.services.context import Context
from credgate.services.integrations import IntegrationChanges
from credgate.services.projects import ProjectChanges
from tests.secret_sweep import SWEEP

KEY = "sk-test-limits-0000000000000abcd"
# Values a front end could hand a service by mistake: typed Any, as the services may not trust their types.
OUT_OF_RANGE_SECONDS: list[Any] = [
    0,
    -1,
    3601,
    2**64,
    2**70,
    float("nan"),
    float("inf"),
    -float("inf"),
    1e400,
    True,
    "30",
]


async def setup(ctx: Context) -> str:
    SWEEP.register(KEY)
    project, _ = await projects.create_project(ctx, name="demo", actor="t")
    await integrations.add_custom_integration(
        ctx, project_id=project.id, provider="acme", base_url="https://api.acme.test", api_key=KEY, actor="t"
    )
    return project.id


async def refused(field: str, change: Coroutine[Any, Any, object]) -> None:
    with pytest.raises(InvalidInput) as raised:
        await change
    assert raised.value.field == field


async def audited(ctx: Context) -> int:
    return len(await audit.list_audit_events(ctx, limit=1000))


@pytest.mark.parametrize("field", ["timeout_seconds", "stream_idle_timeout_seconds"])
async def test_integration_timeouts_out_of_range_are_refused(ctx: Context, field: str) -> None:
    project_id = await setup(ctx)
    events = await audited(ctx)
    for value in OUT_OF_RANGE_SECONDS:
        changes = IntegrationChanges(**{field: value})
        await refused(
            field,
            integrations.update_integration(ctx, project_id=project_id, provider="acme", changes=changes, actor="t"),
        )
    integration = await integrations.get_integration(ctx, project_id=project_id, provider="acme")
    assert (integration.timeout_seconds, integration.stream_idle_timeout_seconds) == (600, 300)
    assert await audited(ctx) == events


async def test_the_stream_idle_timeout_reaches_the_proxy(ctx: Context) -> None:
    project_id = await setup(ctx)
    _, token = await projects.rotate_project_token(ctx, project_id=project_id, actor="t")
    changes = IntegrationChanges(stream_idle_timeout_seconds=0.5)
    await integrations.update_integration(ctx, project_id=project_id, provider="acme", changes=changes, actor="t")
    access = await resolve_access(ctx, token=token, provider="acme")
    assert access is not None
    assert access.integration is not None
    assert (access.integration.stream_idle_timeout_seconds, access.integration.timeout_seconds) == (0.5, 600)


async def test_integration_text_settings_out_of_their_limits_are_refused(ctx: Context) -> None:
    project_id = await setup(ctx)
    cases: list[tuple[str, Any]] = [
        ("base_url", "https://api.acme.test/" + "p" * 2048),
        ("base_url", "https://api.acme.test/\x00"),
        ("headers", {"x-team": "a\x01b"}),
        ("query", {f"q{index}": "x" for index in range(65)}),
        ("enabled", "yes"),
    ]
    for field, value in cases:
        changes = IntegrationChanges(**{field: value})
        await refused(
            field,
            integrations.update_integration(ctx, project_id=project_id, provider="acme", changes=changes, actor="t"),
        )


async def test_token_rotation_out_of_range_is_refused_before_any_date_arithmetic(ctx: Context) -> None:
    project_id = await setup(ctx)
    before = (await projects.get_project(ctx, project_id=project_id)).tokens
    above_grace, above_lifetime = MAX_GRACE.total_seconds() + 1, MAX_TOKEN_LIFETIME.total_seconds() + 1
    graces: list[Any] = [-1, int(above_grace), 2**64, 2**70, True, 1.5]
    for grace in graces:
        await refused(
            "grace_seconds", projects.rotate_project_token(ctx, project_id=project_id, actor="t", grace_seconds=grace)
        )
    lifetimes: list[Any] = [0, -1, int(above_lifetime), 2**64, 2**70, True, 1.5]
    for expires in lifetimes:
        rotation = projects.rotate_project_token(ctx, project_id=project_id, actor="t", expires_in_seconds=expires)
        await refused("expires_in_seconds", rotation)
    after = (await projects.get_project(ctx, project_id=project_id)).tokens
    assert [token.id for token in after] == [token.id for token in before]


async def test_the_longest_token_lifetime_is_a_date_far_from_overflow(ctx: Context) -> None:
    project_id = await setup(ctx)
    lifetime = int(MAX_TOKEN_LIFETIME.total_seconds())
    project, _ = await projects.rotate_project_token(ctx, project_id=project_id, actor="t", expires_in_seconds=lifetime)
    token = projects.current_token(project)
    assert token is not None
    assert token.expires_at is not None
    assert token.expires_at - datetime.now(UTC) > MAX_TOKEN_LIFETIME - timedelta(minutes=1)


async def test_project_names_and_rate_limits_out_of_range_are_refused(ctx: Context) -> None:
    project_id = await setup(ctx)
    for name in ["", "n" * 201, "a\x00b", "tab\there", "\ud800"]:
        await refused("name", projects.create_project(ctx, name=name, actor="t"))
        changes = ProjectChanges(name=name)
        await refused("name", projects.update_project(ctx, project_id=project_id, changes=changes, actor="t"))
    limits: list[Any] = [0, -1, 1_000_001, 2**64, True, 2.5]
    for limit in limits:
        changes = ProjectChanges(rate_limit_per_minute=limit)
        await refused(
            "rate_limit_per_minute", projects.update_project(ctx, project_id=project_id, changes=changes, actor="t")
        )
    caps: list[Any] = [0, -1, 100_001, 2**64, True, 2.5]
    for cap in caps:
        changes = ProjectChanges(max_concurrent_requests=cap)
        await refused(
            "max_concurrent_requests", projects.update_project(ctx, project_id=project_id, changes=changes, actor="t")
        )
    assert [project.name for project in await projects.list_projects(ctx)] == ["demo"]


async def test_list_limits_and_usage_windows_out_of_range_are_refused(ctx: Context) -> None:
    project_id = await setup(ctx)
    for limit in [0, 1001, 2**64, True]:
        await refused("limit", usage.list_request_records(ctx, project_id=project_id, limit=limit))
        await refused("limit", audit.list_audit_events(ctx, limit=limit))
    far = [datetime(1, 1, 1, tzinfo=UTC), datetime.max.replace(tzinfo=UTC), datetime(2024, 1, 1)]
    for moment in far:
        await refused(
            "since", usage.summarize_usage(ctx, project_id=project_id, since=moment, until=None, group_by=None)
        )
        await refused(
            "until", usage.summarize_usage(ctx, project_id=project_id, since=None, until=moment, group_by=None)
        )


async def test_admin_names_and_passwords_out_of_their_limits_are_refused(ctx: Context) -> None:
    await refused("name", admins.create_admin_token(ctx, name="n" * 201, actor="t"))
    await refused("name", admins.create_admin_token(ctx, name="", actor="t"))
    await refused("username", admins.create_admin_user(ctx, username="u" * 201, password="p" * 12, actor="t"))
    await refused("username", admins.create_admin_user(ctx, username="two words", password="p" * 12, actor="t"))
    await refused("password", admins.create_admin_user(ctx, username="alice", password="p" * 11, actor="t"))


@pytest.mark.parametrize("provider", ["Bad Name", "a" * 64, "a\x00", ""])
async def test_an_integration_name_out_of_its_limits_is_refused(ctx: Context, provider: str) -> None:
    project_id = await setup(ctx)
    add = integrations.add_custom_integration(
        ctx, project_id=project_id, provider=provider, base_url="https://api.acme.test", api_key=KEY, actor="t"
    )
    await refused("provider", add)


@pytest.mark.parametrize("project_id", ["prj_\x00", "\ud800", "p" * 33, "prj_é"])
async def test_an_id_that_could_not_exist_is_not_found_without_a_query(ctx: Context, project_id: str) -> None:
    await setup(ctx)
    with pytest.raises(NotFound):
        await projects.get_project(ctx, project_id=project_id)
    with pytest.raises(NotFound):
        await integrations.get_integration(ctx, project_id=project_id, provider="acme")
    assert await audit.list_audit_events(ctx, project_id=project_id) == []
