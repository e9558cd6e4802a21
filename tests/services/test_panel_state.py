"""The panel's state between requests, in the database: shown once, sealed and bound to its session, expired after
ten minutes, gone with its session, resealed by a master-key rotation; on SQLite and PostgreSQL."""

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from credgate.config import Settings
from credgate.crypto import Secret, master_key_id, new_master_key
from credgate.masterkey import read_key_file, write_key_file
from credgate.services import admins, panel_sessions
from credgate.services.context import Context
from credgate.services.panel_state import (
    STATE_TTL,
    Flash,
    PendingSetup,
    find_pending_setup,
    flash_message,
    hold_setup,
    release_setup,
    reseal_panel_state,
    take_flash,
)
from credgate.storage.models import AdminSession
from tests.reliability.test_auth_isolation import (  # noqa: F401  (an autouse fixture)
    _quick_password_hashing,
)
from tests.secret_sweep import SWEEP
from tests.services.helpers import DatabaseFixture, opened

KEY = "sk-test-panel-state-key-0000abcd"
TOKEN = "cgp_test-panel-state-one-time-token"


def setup(api_key: str | None = KEY) -> PendingSetup:
    SWEEP.register(KEY)
    return PendingSetup(
        project_id="prj_1",
        provider="openai",
        template_id="openai-chat-completions",
        api_key=None if api_key is None else Secret(api_key),
        base_url=None,
    )


async def signed_in(ctx: Context, username: str = "admin") -> str:
    """A new panel session's id."""
    await admins.create_admin_user(ctx, username=username, password="correct horse battery staple", actor="t")
    _, user = await panel_sessions.sign_in(ctx, username=username, password="correct horse battery staple")
    return user.session_id


async def session_row(ctx: Context, session_id: str) -> AdminSession | None:
    async with ctx.database.transaction(write=False) as repo:
        return await repo.get_admin_session(session_id)


def later(ctx: Context, delta: timedelta) -> None:
    now = ctx.clock()
    ctx.clock = lambda: now + delta


async def test_messages_and_the_secret_are_shown_once(ctx: Context) -> None:
    session_id = await signed_in(ctx)
    await flash_message(ctx, session_id=session_id, message="Project p created.", secret=TOKEN)
    await flash_message(ctx, session_id=session_id, message="Project settings saved.")
    assert await take_flash(ctx, session_id=session_id) == Flash(
        messages=("Project p created.", "Project settings saved."), secret=TOKEN
    )
    assert await take_flash(ctx, session_id=session_id) == Flash()


async def test_of_two_instances_taking_at_once_only_one_gets_the_secret(
    ctx: Context, settings: Settings, database: DatabaseFixture
) -> None:
    session_id = await signed_in(ctx)
    async with opened(settings, database) as other:
        for _ in range(5):
            await flash_message(ctx, session_id=session_id, message="New project token issued.", secret=TOKEN)
            taken = await asyncio.gather(
                *(take_flash(instance, session_id=session_id) for instance in (ctx, other, ctx, other))
            )
            assert sorted(flash.secret or "" for flash in taken) == ["", "", "", TOKEN]
            assert sum(len(flash.messages) for flash in taken) == 1


async def test_a_pending_setup_expires_after_ten_minutes(ctx: Context) -> None:
    later(ctx, timedelta(0))  # the clock stopped: a slow machine must not spend the second the test leaves
    session_id = await signed_in(ctx)
    await hold_setup(ctx, session_id=session_id, setup=setup())
    later(ctx, STATE_TTL - timedelta(seconds=1))
    found = await find_pending_setup(ctx, session_id=session_id)
    assert found is not None
    assert found.api_key == Secret(KEY)
    later(ctx, timedelta(seconds=2))
    assert await find_pending_setup(ctx, session_id=session_id) is None
    row = await session_row(ctx, session_id)
    assert row is not None
    assert (row.pending_setup, row.pending_setup_at) == (None, None)  # the sealed key is deleted, not just ignored


async def test_a_message_never_shown_is_gone_after_ten_minutes(ctx: Context) -> None:
    session_id = await signed_in(ctx)
    await flash_message(ctx, session_id=session_id, message="Project p created.", secret=TOKEN)
    later(ctx, STATE_TTL + timedelta(seconds=1))
    assert await take_flash(ctx, session_id=session_id) == Flash()


async def test_a_saved_setup_is_released(ctx: Context) -> None:
    session_id = await signed_in(ctx)
    await hold_setup(ctx, session_id=session_id, setup=setup(api_key=None))
    assert await find_pending_setup(ctx, session_id=session_id) == setup(api_key=None)
    await release_setup(ctx, session_id=session_id)
    assert await find_pending_setup(ctx, session_id=session_id) is None


async def test_the_secrets_are_sealed_and_bound_to_their_session(ctx: Context) -> None:
    first, second = await signed_in(ctx, "first"), await signed_in(ctx, "second")
    await flash_message(ctx, session_id=first, message="Project p created.", secret=TOKEN)
    await hold_setup(ctx, session_id=first, setup=setup())
    row = await session_row(ctx, first)
    assert row is not None
    assert row.flash_messages == ["Project p created."]
    stored = repr((row.flash_secret, row.pending_setup))
    assert TOKEN not in stored
    assert KEY not in stored
    async with ctx.database.engine.begin() as connection:  # copied to another session's row: it does not open
        copied = {"flash_secret": row.flash_secret, "flash_at": row.flash_at}
        copied |= {"pending_setup": row.pending_setup, "pending_setup_at": row.pending_setup_at}
        await connection.execute(update(AdminSession).where(AdminSession.id == second).values(**copied))
    assert await find_pending_setup(ctx, session_id=second) is None
    assert await take_flash(ctx, session_id=second) == Flash()


async def test_the_state_ends_with_its_session(ctx: Context) -> None:
    session_id = await signed_in(ctx)
    await flash_message(ctx, session_id=session_id, message="Project p created.", secret=TOKEN)
    await hold_setup(ctx, session_id=session_id, setup=setup())
    await panel_sessions.sign_out(ctx, session_id=session_id)
    assert await session_row(ctx, session_id) is None
    assert await take_flash(ctx, session_id=session_id) == Flash()
    await hold_setup(ctx, session_id=session_id, setup=setup())  # a request still under way: writes nothing
    assert await session_row(ctx, session_id) is None


async def test_a_timed_out_session_never_resumed_goes_with_its_state_at_the_next_sign_in(ctx: Context) -> None:
    abandoned = await signed_in(ctx, "first")
    await hold_setup(ctx, session_id=abandoned, setup=setup())
    later(ctx, panel_sessions.IDLE_TIMEOUT + timedelta(seconds=1))
    kept = await signed_in(ctx, "second")
    async with ctx.database.engine.connect() as connection:
        assert (await connection.execute(select(AdminSession.id))).scalars().all() == [kept]


async def test_rotating_the_master_key_reseals_the_panel_state(ctx: Context, settings: Settings) -> None:
    session_id = await signed_in(ctx)
    await flash_message(ctx, session_id=session_id, message="Project p created.", secret=TOKEN)
    await hold_setup(ctx, session_id=session_id, setup=setup())
    old_keys = read_key_file(settings.master_key_file)
    new_key = new_master_key()
    write_key_file(settings.master_key_file, [new_key, *old_keys])
    assert await reseal_panel_state(ctx) == 2
    assert await reseal_panel_state(ctx) == 0
    write_key_file(settings.master_key_file, [new_key])  # the old key is dropped
    ctx.keyring.refresh()
    row = await session_row(ctx, session_id)
    assert row is not None
    assert row.flash_secret is not None
    assert row.pending_setup is not None
    assert {blob[1:5] for blob in (row.flash_secret, row.pending_setup)} == {master_key_id(new_key)}
    assert await find_pending_setup(ctx, session_id=session_id) == setup()
    assert (await take_flash(ctx, session_id=session_id)).secret == TOKEN


@pytest.mark.parametrize("what", ["secret", "setup"])
async def test_state_sealed_under_a_dropped_master_key_is_dropped_not_an_error(
    ctx: Context, settings: Settings, what: str
) -> None:
    session_id = await signed_in(ctx)
    await flash_message(ctx, session_id=session_id, message="Project p created.", secret=TOKEN)
    await hold_setup(ctx, session_id=session_id, setup=setup())
    write_key_file(settings.master_key_file, [new_master_key()])  # as if rotated without this state
    ctx.keyring.refresh()
    if what == "secret":
        assert await take_flash(ctx, session_id=session_id) == Flash(messages=("Project p created.",))
    else:
        assert await find_pending_setup(ctx, session_id=session_id) is None
