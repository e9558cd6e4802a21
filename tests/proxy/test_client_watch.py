"""The client watch: a relay whose client has left is cancelled soon after, not left to run (and be billed) on."""

import asyncio

from starlette.types import Message

from credgate.proxy.client import WATCH_DELAY_SECONDS, ClientWatch
from credgate.proxy.deadlines import TICK_SECONDS, Deadlines

# The longest a departed client's upstream response may go on, billed, before the relay is cancelled.
NOTICE_BOUND_SECONDS = 0.15


def test_the_watch_delay_and_a_tick_of_the_deadlines_stay_within_the_notice_bound() -> None:
    """The watch starts at the first sweep of the deadlines past its delay: the clock test below, on a busy machine,
    could not tell 0.15 s from 0.25."""
    assert round(WATCH_DELAY_SECONDS + TICK_SECONDS, 6) <= NOTICE_BOUND_SECONDS


async def test_a_relay_whose_client_has_left_is_cancelled_after_the_delay() -> None:
    async def receive() -> Message:
        return {"type": "http.disconnect"}

    deadlines = Deadlines()
    cancelled_after: list[float] = []

    async def relay() -> None:
        loop = asyncio.get_running_loop()
        watch = ClientWatch(receive, deadlines)
        started = loop.time()
        watch.start()  # the request's body is complete: from now on, receive() only reports a departure
        try:
            await asyncio.sleep(10)  # an upstream that goes on streaming
        except asyncio.CancelledError:
            cancelled_after.append(loop.time() - started)
            assert watch.absorb_cancellation()
        finally:
            watch.stop()

    await asyncio.wait_for(relay(), 5)
    assert len(cancelled_after) == 1
    assert WATCH_DELAY_SECONDS <= cancelled_after[0] < 2


async def test_a_watch_stopped_before_its_delay_starts_no_task() -> None:
    """A quick exchange costs an entry in the deadlines' set, not a task: the relay goes on (the response's last
    bytes, the request log's record) past the delay and a tick without a watch starting."""
    asked: list[int] = []

    async def receive() -> Message:
        asked.append(1)
        return {"type": "http.disconnect"}

    deadlines = Deadlines()
    before = len(asyncio.all_tasks())
    tasks_while_relaying: list[int] = []

    async def relay() -> None:
        watch = ClientWatch(receive, deadlines)
        watch.start()
        watch.stop()
        await asyncio.sleep(WATCH_DELAY_SECONDS + 2 * TICK_SECONDS)
        tasks_while_relaying.append(len(asyncio.all_tasks()))

    await asyncio.create_task(relay())
    assert asked == []
    assert tasks_while_relaying == [before + 1]  # the relay's own task alone
