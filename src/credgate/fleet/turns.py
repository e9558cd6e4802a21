"""The questions of one event-loop turn, asked of Redis in one call.

The rate limits, the budgets and the caps on requests under way each ask Redis something for every request. Asked
together, the questions of a turn cost one round trip: under load one call serves many requests, and a request
never waits for another turn. A call that fails, or takes over ANSWER_TIMEOUT_SECONDS, answers None to each of
its questions (the caller then counts in this process); while the outage lasts, questions are answered None at
once, but for one call a second that tries Redis again. A question whose answer nobody waits for (a place given
back after its response) is told, not asked: it joins the turn's call, and is dropped while the outage lasts. Once
closed (the process stopping), a batch calls Redis no more: what is asked then is answered None, what is told
dropped.
"""

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from credgate.fleet.fleet import ANSWER_TIMEOUT_SECONDS
from credgate.outages import Outage

Question = TypeVar("Question")
Answer = TypeVar("Answer")


class TurnBatch(Generic[Question, Answer]):
    def __init__(
        self,
        call: Callable[[list[Question]], Awaitable[Sequence[Answer]]],
        outage: Outage,
        *,
        failed: Callable[[BaseException], None] | None = None,
        abandoned: Callable[[Question, Answer], None] | None = None,
        ends_outage: bool = True,
    ) -> None:
        """`call` answers a turn's questions, in order. `failed` is told of a failed call (the outage by
        default). `abandoned` is given an answer whose request left before it came (a place taken, say).
        `ends_outage`: whether a call that succeeds tells the outage it is over (not for calls that may still
        succeed while the ones that matter fail: a give-back after a take that timed out, say)."""
        self._call = call
        self._outage = outage
        self._ends_outage = ends_outage
        self._failed = failed or outage.failed
        self._abandoned = abandoned
        self._waiting: list[tuple[Question, asyncio.Future[Answer | None] | None]] = []  # None: told
        self._calls: set[asyncio.Task[None]] = set()
        self._closed = False

    async def ask(self, question: Question) -> Answer | None:
        """The answer from this turn's call; None when Redis does not answer (or is known not to)."""
        if self._closed or (not self._waiting and not self._outage.may_try()):
            return None
        answer: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        self._join(question, answer)
        try:
            return await answer
        except asyncio.CancelledError:  # the request left, maybe just as its answer came
            if answer.done() and not answer.cancelled():
                self._abandon(question, answer.result())
            raise

    def tell(self, question: Question) -> None:
        """Put the question to this turn's call, its answer unread; dropped while the call would fail."""
        if not self._outage.failing and not self._closed:
            self._join(question, None)

    def _join(self, question: Question, answer: asyncio.Future[Answer | None] | None) -> None:
        if not self._waiting:
            asyncio.get_running_loop().call_soon(self._send)  # once every question of this turn has joined
        self._waiting.append((question, answer))

    def _send(self) -> None:
        batch, self._waiting = self._waiting, []
        # A request gone before the call: not asked.
        batch = [entry for entry in batch if entry[1] is None or not entry[1].done()]
        if not batch:
            return
        call = asyncio.ensure_future(self._answer(batch))
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)

    async def _answer(self, batch: list[tuple[Question, asyncio.Future[Answer | None] | None]]) -> None:
        answers: list[Answer | None] = [None] * len(batch)
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_SECONDS):
                answers = list(await self._call([question for question, _ in batch]))
        except Exception as error:  # whatever the client raises: no request may fail for it
            self._failed(error)
        else:
            if self._ends_outage:
                self._outage.answered()
        finally:  # cancelled or not, every request waiting gets its answer
            for (question, future), answer in zip(batch, answers, strict=False):
                if future is None:
                    continue
                if future.done():  # its request has gone (the client left)
                    self._abandon(question, answer)
                else:
                    future.set_result(answer)

    def _abandon(self, question: Question, answer: Answer | None) -> None:
        if self._abandoned is not None and answer is not None:
            self._abandoned(question, answer)

    async def aclose(self) -> None:
        """Let the calls under way end (shutting down), each within its answer timeout; never cancelled from here:
        a redis-py call cancelled mid-flight from outside was seen to leave its task waiting for ever. What this
        turn asked or told is sent first; after, nothing is (a call then would go to a client being closed, its
        task awaited by no one)."""
        self._closed = True
        self._send()
        if self._calls:
            await asyncio.wait(set(self._calls), timeout=2 * ANSWER_TIMEOUT_SECONDS)
