"""The client watch: a relay whose client has left is cancelled soon after, not left to run (and be billed) on."""

import asyncio

from starlette.types import Message

from credgate.proxy.client import WATCH_DELAY_SECONDS, ClientWatch
from credgate.proxy.deadlines import Deadlines

SLACK_SECONDS = 0.1  # the event loop's own scheduling, on a busy test machine


async def test_a_relay_whose_client_has_left_is_cancelled_within_the_delay_and_a_tick() -> None:
    """With the client gone before the body is even read, the relay is cancelled once the watch's delay has passed,
    to the next tick of the deadlines. A delay of 0.2 s and a tick of 0.25 let 1,000 departures in bench/soak.py keep
    200 upstream responses going at once, and the gateway 3 MB more."""

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    deadlines = Deadlines()
    cancelled_after: list[float] = []

    async def relay() -> None:
        loop = asyncio.get_running_loop()
        watch = ClientWatch(receive, deadlines)
        started = loop.time()
        watch.start()
        try:
            await asyncio.sleep(10)  # an upstream that goes on streaming
        except asyncio.CancelledError:
            cancelled_after.append(loop.time() - started)
            assert watch.absorb_cancellation()
        finally:
            watch.stop()

    await asyncio.wait_for(relay(), 2)
    assert len(cancelled_after) == 1
    assert WATCH_DELAY_SECONDS <= cancelled_after[0] < 0.15 + SLACK_SECONDS


async def test_a_quick_exchange_starts_no_watching_task() -> None:
    """A relay over before the delay costs an entry in the deadlines' set, not a task."""
    asked: list[int] = []

    async def receive() -> Message:
        asked.append(1)
        return {"type": "http.disconnect"}

    deadlines = Deadlines()
    before = len(asyncio.all_tasks())

    async def relay() -> int:
        watch = ClientWatch(receive, deadlines)
        watch.start()
        watch.finishing = True
        tasks = len(asyncio.all_tasks())
        watch.stop()
        return tasks

    assert await asyncio.create_task(relay()) == before + 1  # the relay's own task alone
    await asyncio.sleep(WATCH_DELAY_SECONDS + 0.2)  # past the delay and a tick: nothing starts late
    assert asked == []
    assert len(asyncio.all_tasks()) == before
