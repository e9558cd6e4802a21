"""Waiting for what happens in the background: a change heard by another worker, a batch of records written,
a connection released. The one poller the tests share."""

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def eventually(check: Callable[[], object | Awaitable[object]], *, within: float, every: float = 0.01) -> bool:
    """Whether `check()` (a plain or an async callable) comes true within `within` seconds; it is asked every
    `every` seconds until then. The caller asserts, with its own message."""
    deadline = time.monotonic() + within
    while True:
        outcome = check()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(every)
