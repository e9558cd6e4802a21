"""The proxy's lookup: token + provider → integration and opened key, cached, and cleared by every change."""

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager

import pytest
from sqlalchemy import event, text

from credgate.config import Settings
from credgate.crypto import Secret
from credgate.services import integrations, projects
from credgate.services.access import Access, follow_notices, resolve_access, watch_database
from credgate.services.context import Context, notify_channel
from credgate.services.integrations import IntegrationChanges
from credgate.specs import BearerAuth, Endpoint
from tests.polling import eventually
from tests.secret_sweep import SWEEP
from tests.services.helpers import DatabaseFixture, opened

KEY = "sk-test-accessaccessaccess12"
NEW_KEY = "sk-test-rotatedrotatedrota34"
BASE_URL = "https://api.openai.com/v1"


async def new_project(ctx: Context) -> tuple[str, str]:
    """A project with an OpenAI integration; returns its id and token."""
    SWEEP.register(KEY)
    SWEEP.register(NEW_KEY)
    project, token = await projects.create_project(ctx, name="demo", actor="tests")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="openai", template_id="openai-chat-completions", api_key=KEY, actor="t"
    )
    return project.id, token


def observe(access: Access | None) -> object:
    """What a proxied request would see: a comparable summary of the lookup."""
    if access is None:
        return "no access"
    if access.integration is None:
        return "no integration"
    found = access.integration
    credential = found.credential.reveal() if found.credential else None
    return (credential, found.enabled, found.base_url, len(found.endpoints), access.rate_limit_per_minute)


async def look(ctx: Context, token: str) -> object:
    return observe(await resolve_access(ctx, token=token, provider="openai"))


@asynccontextmanager
async def following(ctx: Context, settings: Settings) -> AsyncIterator[None]:
    task = asyncio.create_task(watch_database(ctx, interval=settings.change_poll_seconds, stale_seconds=30))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def look_within(ctx: Context, token: str, expected: object, *, seconds: float) -> object:
    """Look until the lookup shows `expected` or the time is up; returns the last observation."""
    deadline = time.monotonic() + seconds
    seen = await look(ctx, token)
    while seen != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        seen = await look(ctx, token)
    return seen


async def test_a_lookup_gives_the_integration_and_its_opened_key(ctx: Context) -> None:
    project_id, token = await new_project(ctx)
    access = await resolve_access(ctx, token=token, provider="openai")
    assert access is not None
    assert access.project_id == project_id
    assert access.integration is not None
    assert access.integration.credential == Secret(KEY)
    assert access.integration.base_url == BASE_URL
    assert access.integration.auth == BearerAuth()
    assert access.integration.endpoints == (Endpoint(method="POST", path="chat/completions"),)
    assert (access.integration.enabled, access.integration.timeout_seconds) == (True, 600)
    assert KEY not in repr(access)


async def test_a_provider_the_project_has_not_set_up_gives_access_without_integration(ctx: Context) -> None:
    project_id, token = await new_project(ctx)
    access = await resolve_access(ctx, token=token, provider="anthropic")
    assert access is not None
    assert (access.project_id, access.integration) == (project_id, None)


@pytest.mark.parametrize("token", ["cgp_unknown", "cgp_", "", "Bearer cgp_x", "cga_admin"])
async def test_an_unknown_token_gives_nothing(ctx: Context, token: str) -> None:
    await new_project(ctx)
    assert await resolve_access(ctx, token=token, provider="openai") is None


async def test_a_token_of_one_project_never_reaches_another(ctx: Context) -> None:
    first_id, first_token = await new_project(ctx)
    second_id, second_token = await new_project(ctx)
    first = await resolve_access(ctx, token=first_token, provider="openai")
    second = await resolve_access(ctx, token=second_token, provider="openai")
    assert first is not None
    assert second is not None
    assert (first.project_id, second.project_id) == (first_id, second_id)


@pytest.fixture
def statements(ctx: Context) -> Iterator[list[str]]:
    """The SQL statements the test's Context sends from now on."""
    sent: list[str] = []

    def record(_connection: object, _cursor: object, statement: str, *_rest: object) -> None:
        sent.append(statement)

    event.listen(ctx.database.engine.sync_engine, "before_cursor_execute", record)
    yield sent
    event.remove(ctx.database.engine.sync_engine, "before_cursor_execute", record)


async def test_a_miss_costs_one_query_and_a_hit_none(ctx: Context, statements: list[str]) -> None:
    _, token = await new_project(ctx)
    statements.clear()
    first = await resolve_access(ctx, token=token, provider="openai")
    assert len([sql for sql in statements if sql.lstrip().upper().startswith("SELECT")]) == 1
    statements.clear()
    assert await resolve_access(ctx, token=token, provider="openai") is first
    assert statements == []


async def test_requests_that_miss_the_same_entry_at_once_share_one_query(ctx: Context, statements: list[str]) -> None:
    _, token = await new_project(ctx)
    statements.clear()
    found = await asyncio.gather(*(resolve_access(ctx, token=token, provider="openai") for _ in range(50)))
    assert len([sql for sql in statements if sql.lstrip().upper().startswith("SELECT")]) == 1
    assert len({id(access) for access in found}) == 1
    assert ctx.access.loading == {}


async def test_a_request_after_a_change_never_joins_a_lookup_begun_before_it(ctx: Context) -> None:
    project_id, token = await new_project(ctx)
    before = asyncio.ensure_future(resolve_access(ctx, token=token, provider="openai"))
    await asyncio.sleep(0)  # the first lookup is under way, reading the old key
    await set_key(ctx, project_id)
    after = await resolve_access(ctx, token=token, provider="openai")
    await before
    assert observe(after) == observe(await resolve_access(ctx, token=token, provider="openai"))
    assert after is not None
    assert after.integration is not None
    assert after.integration.credential is not None
    assert after.integration.credential.reveal() == NEW_KEY


Change = Callable[[Context, str], Awaitable[None]]


async def set_key(ctx: Context, project_id: str) -> None:
    await integrations.set_provider_key(ctx, project_id=project_id, provider="openai", api_key=NEW_KEY, actor="tests")


async def revoke_key(ctx: Context, project_id: str) -> None:
    await integrations.revoke_provider_key(ctx, project_id=project_id, provider="openai", actor="tests")


async def disable(ctx: Context, project_id: str) -> None:
    changes = IntegrationChanges(enabled=False)
    await integrations.update_integration(ctx, project_id=project_id, provider="openai", changes=changes, actor="tests")


async def move(ctx: Context, project_id: str) -> None:
    changes = IntegrationChanges(base_url="https://moved.example/v1")
    await integrations.update_integration(ctx, project_id=project_id, provider="openai", changes=changes, actor="tests")


async def add_endpoint(ctx: Context, project_id: str) -> None:
    endpoints = [Endpoint(method="POST", path="chat/completions"), Endpoint(method="GET", path="models")]
    await integrations.set_endpoints(ctx, project_id=project_id, provider="openai", endpoints=endpoints, actor="tests")


async def limit_rate(ctx: Context, project_id: str) -> None:
    changes = projects.ProjectChanges(rate_limit_per_minute=60)
    await projects.update_project(ctx, project_id=project_id, changes=changes, actor="tests")


async def delete_integration(ctx: Context, project_id: str) -> None:
    await integrations.delete_integration(ctx, project_id=project_id, provider="openai", actor="tests")


async def delete_project(ctx: Context, project_id: str) -> None:
    await projects.delete_project(ctx, project_id=project_id, actor="tests")


async def revoke_tokens(ctx: Context, project_id: str) -> None:
    await projects.revoke_project_tokens(ctx, project_id=project_id, actor="tests")


BEFORE = (KEY, True, BASE_URL, 1, None)
CHANGES = [
    pytest.param(set_key, (NEW_KEY, True, BASE_URL, 1, None), id="set key"),
    pytest.param(revoke_key, (None, True, BASE_URL, 1, None), id="revoke key"),
    pytest.param(disable, (KEY, False, BASE_URL, 1, None), id="disable"),
    pytest.param(move, (KEY, True, "https://moved.example/v1", 1, None), id="base url"),
    pytest.param(add_endpoint, (KEY, True, BASE_URL, 2, None), id="endpoints"),
    pytest.param(limit_rate, (KEY, True, BASE_URL, 1, 60), id="rate limit"),
    pytest.param(delete_integration, "no integration", id="delete integration"),
    pytest.param(delete_project, "no access", id="delete project"),
    pytest.param(revoke_tokens, "no access", id="revoke tokens"),
]


@pytest.mark.parametrize(("change", "expected"), CHANGES)
async def test_a_change_is_seen_by_the_next_lookup(ctx: Context, change: Change, expected: object) -> None:
    project_id, token = await new_project(ctx)
    assert await look(ctx, token) == BEFORE
    await change(ctx, project_id)
    assert await look(ctx, token) == expected


@pytest.mark.parametrize(("change", "expected"), CHANGES)
async def test_a_change_by_another_instance_is_seen_within_a_second(
    ctx: Context, settings: Settings, database: DatabaseFixture, change: Change, expected: object
) -> None:
    project_id, token = await new_project(ctx)
    async with following(ctx, settings), opened(settings, database) as other:
        await asyncio.sleep(0.1)  # the follower takes its first look
        assert await look(ctx, token) == BEFORE
        await change(other, project_id)
        assert await look_within(ctx, token, expected, seconds=1.0) == expected


async def test_a_change_clears_the_cache_once_and_not_again_at_the_next_poll(ctx: Context, settings: Settings) -> None:
    """The poll finds the marker the change was cleared for: the cache it refilled since is kept."""
    project_id, _ = await new_project(ctx)
    async with following(ctx, settings):
        await asyncio.sleep(settings.change_poll_seconds * 2)  # past the first poll
        generation = ctx.access.generation
        await set_key(ctx, project_id)
        await asyncio.sleep(settings.change_poll_seconds * 3)
        assert ctx.access.generation == generation + 1


async def test_a_change_made_before_the_follower_starts_is_seen_within_a_second(
    ctx: Context, settings: Settings, database: DatabaseFixture
) -> None:
    # An instance serves (and caches) from the moment it starts; its follower's first look comes a little later.
    project_id, token = await new_project(ctx)
    assert await look(ctx, token) == BEFORE
    async with opened(settings, database) as other:
        await set_key(other, project_id)
    async with following(ctx, settings):
        expected = (NEW_KEY, True, BASE_URL, 1, None)
        assert await look_within(ctx, token, expected, seconds=1.0) == expected


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
@pytest.mark.parametrize(("change", "expected"), CHANGES)
async def test_on_postgresql_without_redis_a_change_by_another_instance_is_heard_within_100_ms(
    ctx: Context, settings: Settings, database: DatabaseFixture, change: Change, expected: object
) -> None:
    """LISTEN/NOTIFY: the notice is sent on commit; no polling runs here, so only it can clear the cache."""
    project_id, token = await new_project(ctx)
    async with listening(ctx), opened(settings, database) as other:
        assert await look(ctx, token) == BEFORE
        await change(other, project_id)
        assert await look_within(ctx, token, expected, seconds=0.1) == expected


@asynccontextmanager
async def listening(ctx: Context) -> AsyncIterator[None]:
    """follow_notices running, and listening: its first LISTEN has cleared the cache."""
    generation = ctx.access.generation
    task = asyncio.create_task(follow_notices(ctx))
    try:
        assert await eventually(lambda: ctx.access.generation > generation, within=5)
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_a_listening_connection_the_server_ends_is_replaced_and_changes_are_heard_again(
    ctx: Context, settings: Settings, database: DatabaseFixture, caplog: pytest.LogCaptureFixture
) -> None:
    project_id, token = await new_project(ctx)
    async with listening(ctx), opened(settings, database) as other:
        generation = ctx.access.generation
        async with other.database.engine.connect() as admin:
            ended = await admin.scalar(
                text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = :listen"),
                {"listen": f'LISTEN "{notify_channel(ctx)}"'},
            )
        assert ended == 1
        assert await eventually(lambda: ctx.access.generation > generation, within=5)  # listening again
        assert await look(ctx, token) == BEFORE
        await set_key(other, project_id)
        assert await look_within(ctx, token, (NEW_KEY, True, BASE_URL, 1, None), seconds=0.1) != BEFORE
    messages = [record.getMessage() for record in caplog.records]
    assert any(message.startswith("lost the database's change notices") for message in messages)
    assert "the database's change notices resumed" in messages
