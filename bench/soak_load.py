"""The soak's load: operations picked by index, run by a fixed number of clients with keep-alive connections,
each bounded in time, and a tally of what came back."""

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from soak_client import (
    AUTH_FAILURE,
    JSON,
    SSE,
    STREAMED_429,
    UPSTREAM_429,
    UPSTREAM_500,
    Connection,
    Kind,
    UnexpectedReply,
    leave_mid_stream,
)
from soak_report import Check

LEAVE: Literal["leave"] = "leave"  # open an endless stream, read three events, leave
Operation = Kind | Literal["leave"]
Pick = Callable[[int], Operation]
# The mixed soak's cycle of 20: SSE 45 %, JSON 25 %, upstream errors 15 %, auth failures 10 %, disconnects 5 %.
MIX: tuple[Operation, ...] = (
    (SSE,) * 9 + (JSON,) * 5 + (UPSTREAM_429, UPSTREAM_500, STREAMED_429) + (AUTH_FAILURE,) * 2 + (LEAVE,)
)
REQUEST_TIMEOUT_SECONDS = 10.0
FAILURES = (OSError, EOFError, TimeoutError, asyncio.LimitOverrunError, UnexpectedReply, ValueError, IndexError)


@dataclass
class Tally:
    label: str
    expected: Counter[str] = field(default_factory=Counter)
    wrong: Counter[str] = field(default_factory=Counter)
    left_at: dict[str, float] = field(default_factory=dict)  # stream id → when its client left
    seconds: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.expected.values()) + sum(self.wrong.values())

    def summary(self) -> str:
        text = (
            f"{self.count:,} in {self.seconds:.1f} s ({self.count / max(self.seconds, 1e-9):,.0f}/s), "
            f"{sum(self.wrong.values())} not as expected"
        )
        if self.wrong:
            text += ": " + "; ".join(f"{count}× {what}" for what, count in self.wrong.most_common(3))
        return text

    def check(self, item: str, text: str) -> Check:
        return Check(item, text, self.count > 0 and not self.wrong, self.summary())


class Load:
    def __init__(self, port: int, token: str, concurrency: int) -> None:
        self.port = port
        self.token = token
        self.concurrency = concurrency
        self.runs = 0

    async def run(self, label: str, count: int, pick: Pick) -> Tally:
        self.runs += 1
        tally = Tally(label)
        indices = iter(range(count))  # shared: each client takes the next index
        started = time.monotonic()
        await asyncio.gather(*(self._client(tally, indices, pick) for _ in range(min(self.concurrency, count))))
        tally.seconds = time.monotonic() - started
        return tally

    async def _client(self, tally: Tally, indices: Iterator[int], pick: Pick) -> None:
        connection: Connection | None = None
        try:
            for index in indices:
                operation = pick(index)
                try:
                    async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                        if not isinstance(operation, Kind):
                            stream = f"r{self.runs}-{index}"
                            reset = index % 4 == 3
                            tally.left_at[stream] = await leave_mid_stream(self.port, self.token, stream, reset=reset)
                            tally.expected["mid-stream disconnect"] += 1
                            continue
                        connection = connection or await Connection.open(self.port)
                        status, body = await connection.exchange(operation.request(self.token))
                except FAILURES as error:
                    name = operation.name if isinstance(operation, Kind) else "mid-stream disconnect"
                    tally.wrong[f"{name}: {type(error).__name__} {error}"[:120]] += 1
                    if connection is not None:
                        connection.close()
                        connection = None
                    continue
                if connection.closed:
                    connection = None
                problem = operation.verdict(status, body)
                if problem is None:
                    tally.expected[operation.name] += 1
                else:
                    tally.wrong[f"{operation.name}: {problem}"] += 1
        finally:
            if connection is not None:
                connection.close()
