"""Time limits for the many waits of the proxy at the cost of a set entry each.

`asyncio.timeout` arms and disarms a loop timer every time (about 10 µs with uvloop), and a proxied request waits
twice under a limit: for the client's body and for the upstream's answer. Here one loop timer, running only
while some wait is under way, looks every `tick` seconds for waits past their deadline and cancels their task;
the wait then raises TimeoutError, as `asyncio.timeout` would. A limit is kept to within one tick, which is
nothing next to the proxy's limits (a minute or so). Anything with a `deadline` and an `expire()` may be kept the
same way (the client watch starts so).
"""

import asyncio
from types import TracebackType
from typing import Protocol


class Expiring(Protocol):
    """What a tick expires once `deadline` (the loop's time) has passed: `expire()` is then called, once."""

    deadline: float

    def expire(self) -> None: ...


TICK_SECONDS = 0.1  # how late a limit may fire; a departed client's notice waits on it too (proxy/client.py)


class Deadlines:
    def __init__(self, *, tick: float = TICK_SECONDS) -> None:
        self._tick = tick
        self._waits: set[Expiring] = set()
        self._timer: asyncio.TimerHandle | None = None

    def within(self, seconds: float) -> "Within":
        """A context manager: TimeoutError if the block is still waiting `seconds` (to a tick) after it began."""
        return Within(self, seconds)

    def add(self, wait: Expiring, loop: asyncio.AbstractEventLoop) -> None:
        self._waits.add(wait)
        if self._timer is None:
            self._timer = loop.call_later(self._tick, self._sweep, loop)

    def discard(self, wait: Expiring) -> None:
        self._waits.discard(wait)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for wait in [wait for wait in self._waits if wait.deadline <= now]:
            self._waits.discard(wait)
            wait.expire()
        self._timer = loop.call_later(self._tick, self._sweep, loop) if self._waits else None


class Within:
    """One wait under a limit (Deadlines.within)."""

    __slots__ = ("_cancelling", "_deadlines", "_seconds", "_task", "deadline", "expired")

    def __init__(self, deadlines: Deadlines, seconds: float) -> None:
        self._deadlines = deadlines
        self._seconds = seconds
        self.expired = False

    def __enter__(self) -> "Within":
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.within is used inside a task")
        loop = task.get_loop()
        self._task = task
        self._cancelling = task.cancelling()
        self.deadline = loop.time() + self._seconds
        self._deadlines.add(self, loop)
        return self

    def expire(self) -> None:
        self.expired = True
        self._task.cancel()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._deadlines.discard(self)
        # As asyncio.timeout: the cancellation this wait made becomes TimeoutError, unless someone else's is also
        # pending (then the task is being cancelled for real and must stay so).
        if self.expired and self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
            raise TimeoutError from error
