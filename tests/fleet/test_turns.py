"""The questions of one event-loop turn in one call: asked (answered to each asker) and told (answer unread)."""

import asyncio
import logging

from credgate.fleet.turns import TurnBatch
from credgate.outages import Outage

logger = logging.getLogger(__name__)


class Answerer:
    """A call that records each batch it is given and answers every question doubled, or fails while `down`."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.down = False

    async def __call__(self, questions: list[int]) -> list[int]:
        self.calls.append(questions)
        if self.down:
            raise ConnectionError("down")
        return [question * 2 for question in questions]


def outage() -> Outage:
    return Outage(logger, down="down (%s)", back="back")


async def test_what_a_turn_asks_and_tells_goes_in_one_call_in_order_and_each_asker_gets_its_answer() -> None:
    call = Answerer()
    batch: TurnBatch[int, int] = TurnBatch(call, outage())
    answers = asyncio.gather(batch.ask(2), batch.ask(3))
    await asyncio.sleep(0)  # both asked: the turn's call is not sent yet
    batch.tell(1)
    batch.tell(4)
    assert list(await answers) == [4, 6]
    assert call.calls == [[2, 3, 1, 4]]
    batch.tell(5)  # a later turn: a call of its own
    await batch.aclose()
    assert call.calls == [[2, 3, 1, 4], [5]]


async def test_closing_sends_what_this_turn_told_before_the_loop_turns() -> None:
    call = Answerer()
    batch: TurnBatch[int, int] = TurnBatch(call, outage())
    batch.tell(7)
    await batch.aclose()
    assert call.calls == [[7]]


async def test_while_the_call_fails_a_question_told_is_dropped_and_one_asked_answers_none() -> None:
    call, down = Answerer(), outage()
    batch: TurnBatch[int, int] = TurnBatch(call, down)
    call.down = True
    assert await batch.ask(1) is None
    assert down.failing
    batch.tell(2)  # dropped: no call is made for it
    assert await batch.ask(3) is None  # and none for this one within the retry period
    await batch.aclose()
    assert call.calls == [[1]]


async def test_a_batch_that_does_not_end_outages_leaves_one_failing_when_its_call_succeeds() -> None:
    """Give-backs: their call may succeed while the takes that share the outage fail (a take timed out)."""
    down = Outage(logger, down="down (%s)", back="back", retry_seconds=0)  # every question may try again
    down.failed(ConnectionError("down"))
    call = Answerer()
    assert await TurnBatch(call, down, ends_outage=False).ask(1) == 2
    assert down.failing
    assert await TurnBatch(call, down).ask(3) == 6
    assert not down.failing  # one that ends outages does


async def test_once_closed_a_batch_calls_no_more_what_is_asked_answers_none_and_what_is_told_is_dropped() -> None:
    """A place given back as the process stops, after the fleet's batches closed: no call to a client being closed,
    in a task nobody awaits (its lease frees the place in Redis)."""
    call = Answerer()
    batch: TurnBatch[int, int] = TurnBatch(call, outage())
    batch.tell(1)
    await batch.aclose()
    batch.tell(2)
    assert await batch.ask(3) is None
    await asyncio.sleep(0.01)  # a turn or two: a call scheduled by either would have been made
    assert call.calls == [[1]]
    assert not batch._calls
