"""A fast stand-in upstream for the benchmark: raw asyncio HTTP/1.1 with keep-alive, so that it is never the
bottleneck. POST /v1/chat/completions answers a fixed OpenAI-style JSON; GET /v1/sse answers an event stream
whose first event leaves at once (for time-to-first-byte); POST /v1/traces takes an OTLP export."""

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
    uvloop = None  # type: ignore[assignment]

CHAT = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the benchmark upstream."},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":8,"total_tokens":20}}'
)
CHAT_RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(CHAT)).encode()
    + b"\r\n\r\n"
    + CHAT
)
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
SSE_EVENT = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


TRACES_ACCEPTED = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
SSE_DONE = chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"  # the last event, then the end of the chunked body


class Upstream(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buffer = b""
        self.streams: set[asyncio.Task[None]] = set()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            marker = head.find(b"content-length:")
            if marker >= 0:
                length = int(head[marker + 15 : head.find(b"\r\n", marker) if head.find(b"\r\n", marker) > 0 else None])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.respond(head)

    def respond(self, head: bytes) -> None:
        """Answer one request, given its head in lower case."""
        if head.startswith(b"get /v1/sse"):
            self.spawn(self.stream_events())
        elif head.startswith(b"post /v1/traces"):  # a gateway's OTLP export, taken as a collector would
            self.transport.write(TRACES_ACCEPTED)
        else:
            self.transport.write(CHAT_RESPONSE)

    def spawn(self, response: Coroutine[Any, Any, None]) -> None:
        """Write a response that takes time, as a task of this connection."""
        stream = asyncio.ensure_future(response)
        self.streams.add(stream)
        stream.add_done_callback(self.streams.discard)

    async def stream_events(self) -> None:
        self.transport.write(SSE_HEAD + chunk(SSE_EVENT))
        for _ in range(3):
            await asyncio.sleep(0.01)
            self.transport.write(chunk(SSE_EVENT))
        self.transport.write(SSE_DONE)


async def main(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Upstream, "127.0.0.1", port, backlog=1024)
    print(f"upstream listening on {port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    (uvloop.run if uvloop else asyncio.run)(main(int(sys.argv[1])))
