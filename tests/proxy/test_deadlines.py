"""Deadlines: time limits kept by one sweeping timer, with asyncio.timeout's meaning."""

import asyncio

import pytest

from credgate.proxy.deadlines import Deadlines


async def test_a_wait_past_its_limit_raises_timeout_error_within_a_tick() -> None:
    deadlines = Deadlines(tick=0.02)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError), deadlines.within(0.05):
        await asyncio.sleep(5)
    assert 0.05 <= loop.time() - started < 0.05 + 0.02 + 0.05  # the limit, a tick, scheduling slack


async def test_a_wait_that_ends_in_time_is_untouched_and_the_timer_stops() -> None:
    deadlines = Deadlines(tick=0.01)
    with deadlines.within(1.0):
        await asyncio.sleep(0.03)  # several ticks
    await asyncio.sleep(0.03)
    assert deadlines._timer is None
    assert not deadlines._waits
    await asyncio.sleep(0)  # and the task is not cancelled later


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    deadlines = Deadlines(tick=0.01)

    async def waiting() -> None:
        with deadlines.within(10):
            await asyncio.sleep(5)

    task = asyncio.create_task(waiting())
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_expiry_and_an_outside_cancellation_together_stay_a_cancellation() -> None:
    """As asyncio.timeout: when the task is also cancelled for real, it must not be turned into a timeout."""
    deadlines = Deadlines(tick=0.01)

    async def waiting() -> None:
        with deadlines.within(0.01):
            await asyncio.sleep(5)

    task = asyncio.create_task(waiting())
    await asyncio.sleep(0)
    for wait in list(deadlines._waits):
        wait.expire()  # the sweep and an outside cancel in the same loop turn
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_many_waits_with_different_limits_expire_each_at_its_own() -> None:
    deadlines = Deadlines(tick=0.01)
    loop = asyncio.get_running_loop()
    started = loop.time()
    expired: dict[float, float] = {}

    async def waiting(limit: float) -> None:
        try:
            with deadlines.within(limit):
                await asyncio.sleep(1)
        except TimeoutError:
            expired[limit] = loop.time() - started

    await asyncio.gather(*(waiting(limit) for limit in (0.08, 0.02, 0.05, 2.0)), return_exceptions=True)
    # Never before its own limit (a loaded machine may sweep late, never early); the long wait never cut short.
    assert sorted(expired) == [0.02, 0.05, 0.08]
    assert all(after >= limit for limit, after in expired.items()), expired
