"""The panel behind a round-robin balancer: two gateway instances on one database, each request of a session
going to the other one. The one-time token and the Add-new-API set-up live in the database, sealed, so every step
works whichever instance serves it; nothing of them is ever stored in plaintext."""

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from credgate.app import create_app
from credgate.config import Settings
from credgate.services import admins, integrations
from credgate.services.context import Context
from credgate.services.panel_state import STATE_TTL
from credgate.storage.models import AdminSession
from tests.admin_ui.test_pages import shown_token
from tests.admin_ui.test_security import PASSWORD, csrf_of
from tests.secret_sweep import SWEEP, exposed
from tests.services.helpers import DatabaseFixture, every_row, opened

KEY = "sk-test-panel-balanced-key-0000mnop"


class RoundRobin(httpx.AsyncBaseTransport):
    """A balancer in front of several instances: each request goes to the next one in turn."""

    def __init__(self, *contexts: Context, settings: Settings) -> None:
        self._transports = [httpx.ASGITransport(app=create_app(settings, context=ctx)) for ctx in contexts]
        self.served: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        index = len(self.served) % len(self._transports)
        self.served.append(index)
        return await self._transports[index].handle_async_request(request)


def served_by(client: httpx.AsyncClient) -> int:
    """The instance that served the client's last request."""
    transport = client._transport
    assert isinstance(transport, RoundRobin)
    return transport.served[-1]


@pytest.fixture
async def other(settings: Settings, database: DatabaseFixture, ctx: Context) -> AsyncIterator[Context]:
    """A second instance (its own Context, engine and key ring) on the test's database."""
    async with opened(settings, database) as context:
        yield context


@pytest.fixture
async def balanced(ctx: Context, other: Context, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A browser signed in to the panel through the balancer."""
    SWEEP.register(KEY)
    await admins.create_admin_user(ctx, username="admin", password=PASSWORD, actor="tests")
    transport = RoundRobin(ctx, other, settings=settings)
    async with httpx.AsyncClient(transport=transport, base_url="http://credgate.test") as client:
        form = await client.get("/admin/login")
        signed_in = await client.post(
            "/admin/login", data={"csrf": csrf_of(form.text), "username": "admin", "password": PASSWORD}
        )
        assert signed_in.status_code == 303
        yield client


async def stored_state(ctx: Context, settings: Settings) -> bytes:
    """Every row of every table, and on SQLite the database's files as they are on disk."""
    async with ctx.database.engine.connect() as connection:
        data = "\n".join(await every_row(connection)).encode()
    if ctx.database.file is not None:
        for path in (ctx.database.file, Path(f"{ctx.database.file}-wal")):
            data += path.read_bytes() if path.exists() else b""
    return data


async def test_the_one_time_token_is_shown_by_the_other_instance_once(
    balanced: httpx.AsyncClient, ctx: Context, settings: Settings
) -> None:
    csrf = csrf_of((await balanced.get("/admin/projects")).text)
    created = await balanced.post("/admin/projects", data={"csrf": csrf, "name": "balanced"})
    assert created.status_code == 303
    creator = served_by(balanced)
    at_rest = await stored_state(ctx, settings)
    shown = await balanced.get(created.headers["location"])
    assert served_by(balanced) != creator
    token = shown_token(shown.text)
    assert token is not None
    assert token.startswith("cgp_")
    assert "Project balanced created." in shown.text
    assert not exposed(at_rest, [token])  # it waited sealed, never in plaintext
    assert shown_token((await balanced.get(created.headers["location"])).text) is None  # once, on either instance
    assert shown_token((await balanced.get(created.headers["location"])).text) is None


async def test_each_step_of_add_new_api_can_land_on_either_instance(
    balanced: httpx.AsyncClient, ctx: Context, other: Context, settings: Settings
) -> None:
    csrf = csrf_of((await balanced.get("/admin/projects")).text)
    project = (await balanced.post("/admin/projects", data={"csrf": csrf, "name": "p"})).headers["location"]
    await balanced.get(project)  # the token is shown
    choose = await balanced.get(f"{project}/add?provider=openai")
    assert 'name="api_key"' in choose.text
    entered = await balanced.post(
        f"{project}/add",
        data={
            "csrf": csrf,
            "provider": "openai",
            "name": "openai",
            "template": "openai-chat-completions",
            "api_key": KEY,
        },
    )
    assert (entered.status_code, entered.headers["location"]) == (303, f"{project}/add/review")
    served = [served_by(balanced)]
    assert not exposed(await stored_state(ctx, settings), [KEY])  # the pending key waits sealed
    for _ in range(2):  # the review, from one instance and then the other
        review = await balanced.get(f"{project}/add/review")
        assert review.status_code == 200
        assert "…mnop" in review.text
        assert KEY not in review.text
        served.append(served_by(balanced))
    saved = await balanced.post(f"{project}/add/review", data={"csrf": csrf})
    served.append(served_by(balanced))
    assert served == [served[0], 1 - served[0], served[0], 1 - served[0]]  # each step on the other instance
    assert (saved.status_code, saved.headers["location"]) == (303, project)
    assert "openai set up." in (await balanced.get(project)).text
    project_id = project.rsplit("/", 1)[1]
    for instance in (ctx, other):
        integration = await integrations.get_integration(instance, project_id=project_id, provider="openai")
        assert integration.key is not None
        assert integration.key.hint == "…mnop"
    again = await balanced.get(f"{project}/add/review")  # saved: the set-up is gone on both instances
    assert (again.status_code, again.headers["location"]) == (303, f"{project}/add")


async def test_a_setup_left_for_ten_minutes_is_gone(balanced: httpx.AsyncClient, ctx: Context, other: Context) -> None:
    csrf = csrf_of((await balanced.get("/admin/projects")).text)
    project = (await balanced.post("/admin/projects", data={"csrf": csrf, "name": "p"})).headers["location"]
    data = {"csrf": csrf, "provider": "openai", "name": "openai", "template": "openai-chat-completions", "api_key": KEY}
    assert (await balanced.post(f"{project}/add", data=data)).status_code == 303
    now = ctx.clock()
    for instance in (ctx, other):
        instance.clock = lambda: now + STATE_TTL + timedelta(seconds=1)
    review = await balanced.get(f"{project}/add/review")
    assert (review.status_code, review.headers["location"]) == (303, f"{project}/add")


async def test_signing_out_on_one_instance_ends_the_state_on_both(balanced: httpx.AsyncClient, ctx: Context) -> None:
    csrf = csrf_of((await balanced.get("/admin/projects")).text)
    project = (await balanced.post("/admin/projects", data={"csrf": csrf, "name": "p"})).headers["location"]
    data = {"csrf": csrf, "provider": "openai", "name": "openai", "template": "openai-chat-completions", "api_key": KEY}
    assert (await balanced.post(f"{project}/add", data=data)).status_code == 303  # a token and a set-up waiting
    assert (await balanced.post("/admin/logout", data={"csrf": csrf})).status_code == 303
    async with ctx.database.engine.connect() as connection:
        assert (await connection.execute(select(AdminSession))).all() == []
