"""The soak's stand-in upstream: bench/upstream.py's answers, plus endless event streams and provider errors
(whole and streamed), and a control port that tells what the gateway does to it: the connections it holds open,
those with a response under way, their peaks, and when the connection of each endless stream closed.

    python bench/soak_upstream.py PORT CONTROL_PORT

Routes: /v1/soak/endless/<id> streams an event every 20 ms for at most 60 s; /v1/soak/status/<code> answers a
provider error; /v1/soak/stream-status/<code> answers it chunked, in two parts, as providers do for streamed
calls. The control port answers GET /stats, GET /closes (endless stream id → CLOCK_MONOTONIC time its connection
closed, comparable with the soak's own time.monotonic()) and GET /reset (peaks back to the current values).
"""

import asyncio
import json
import sys
import time
from collections.abc import Coroutine
from typing import Any

from upstream import SSE_DONE, SSE_EVENT, SSE_HEAD, Upstream, chunk

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
    uvloop = None  # type: ignore[assignment]

ENDLESS_SECONDS = 60.0
EVENT_INTERVAL_SECONDS = 0.02
ERROR_BODIES = {
    429: b'{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}',
    500: b'{"error":{"message":"The server had an error while processing your request.","type":"server_error"}}',
}
_REASONS = {429: b"Too Many Requests", 500: b"Internal Server Error"}
_ERROR_HEADERS = b"content-type: application/json\r\nretry-after: 1\r\nx-ratelimit-remaining-requests: 0\r\n"


def error_response(status: int) -> bytes:
    body = ERROR_BODIES[status]
    head = b"HTTP/1.1 %d %s\r\n%scontent-length: %d\r\n\r\n" % (status, _REASONS[status], _ERROR_HEADERS, len(body))
    return head + body


class Ledger:
    """The upstream side of the gateway's connections."""

    def __init__(self) -> None:
        self.open = self.active = self.peak_open = self.peak_active = 0
        self.closed_at: dict[str, float] = {}
        self.ran_out: list[str] = []  # endless streams that were never cut: their client's departure was missed

    def opened(self) -> None:
        self.open += 1
        self.peak_open = max(self.peak_open, self.open)

    def begin(self) -> None:
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)

    def stats(self) -> dict[str, Any]:
        return {
            "open": self.open,
            "active": self.active,
            "peak_open": self.peak_open,
            "peak_active": self.peak_active,
            "ran_out": self.ran_out[:100],
        }

    def reset(self) -> None:
        self.peak_open, self.peak_active = self.open, self.active


class SoakUpstream(Upstream):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.stream_id: str | None = None  # the endless stream this connection carries, if any

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.ledger.opened()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ledger.open -= 1
        if self.stream_id is not None:
            self.ledger.closed_at[self.stream_id] = time.monotonic()
        for stream in self.streams:
            stream.cancel()

    def respond(self, head: bytes) -> None:
        path = head.split(b" ", 2)[1]
        if path.startswith(b"/v1/soak/endless/"):
            self.spawn(self.stream_endlessly(path.rsplit(b"/", 1)[1].decode()))
        elif path.startswith(b"/v1/soak/status/"):
            self.transport.write(error_response(int(path.rsplit(b"/", 1)[1])))
        elif path.startswith(b"/v1/soak/stream-status/"):
            self.spawn(self.stream_error(int(path.rsplit(b"/", 1)[1])))
        else:
            super().respond(head)

    def spawn(self, response: Coroutine[Any, Any, None]) -> None:
        self.ledger.begin()
        super().spawn(self._counted(response))

    async def _counted(self, response: Coroutine[Any, Any, None]) -> None:
        try:
            await response
        finally:
            self.ledger.active -= 1

    async def stream_endlessly(self, stream_id: str) -> None:
        self.stream_id = stream_id
        self.transport.write(SSE_HEAD + chunk(SSE_EVENT))
        deadline = time.monotonic() + ENDLESS_SECONDS
        while time.monotonic() < deadline:
            await asyncio.sleep(EVENT_INTERVAL_SECONDS)
            self.transport.write(chunk(SSE_EVENT))
        self.ledger.ran_out.append(stream_id)
        self.stream_id = None
        self.transport.write(SSE_DONE)

    async def stream_error(self, status: int) -> None:
        body = ERROR_BODIES[status]
        head = b"HTTP/1.1 %d %s\r\n%stransfer-encoding: chunked\r\n\r\n" % (status, _REASONS[status], _ERROR_HEADERS)
        self.transport.write(head + chunk(body[:20]))
        await asyncio.sleep(0.005)
        self.transport.write(chunk(body[20:]) + b"0\r\n\r\n")


class Control(asyncio.Protocol):
    """One request per connection: the ledger as JSON, then close."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\r\n\r\n" not in self.buffer:
            return
        path = self.buffer.split(b" ", 2)[1]
        if path == b"/reset":
            self.ledger.reset()
        answer = self.ledger.closed_at if path == b"/closes" else self.ledger.stats()
        body = json.dumps(answer).encode()
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        self.transport.close()


async def main(port: int, control_port: int) -> None:
    loop = asyncio.get_running_loop()
    ledger = Ledger()
    server = await loop.create_server(lambda: SoakUpstream(ledger), "127.0.0.1", port, backlog=1024)
    control = await loop.create_server(lambda: Control(ledger), "127.0.0.1", control_port)
    print(f"soak upstream listening on {port}, control on {control_port}", flush=True)
    async with server, control:
        await server.serve_forever()


if __name__ == "__main__":
    (uvloop.run if uvloop else asyncio.run)(main(int(sys.argv[1]), int(sys.argv[2])))
