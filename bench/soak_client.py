"""The soak's client: raw HTTP/1.1 on asyncio streams (cheap next to the gateway, so the load is the gateway's),
the kinds of request the soak sends with what each must get back, and a client that leaves mid-stream."""

import asyncio
import secrets
import socket
import struct
import time
from dataclasses import dataclass

from soak_upstream import ERROR_BODIES
from upstream import CHAT, SSE_EVENT

PROMPT = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello."}]}'
SSE_BODY = SSE_EVENT * 4 + b"data: [DONE]\n\n"
EVENTS_BEFORE_LEAVING = 3


class UnexpectedReply(Exception):
    """The gateway answered what the soak did not expect (or broke the framing)."""


@dataclass(frozen=True)
class Kind:
    """A kind of request and what the gateway must answer: the status and, where known, the exact body."""

    name: str
    method: str
    path: str
    status: int
    body: bytes | None
    payload: bytes = b""
    authorized: bool = True

    def request(self, token: str) -> bytes:
        if not self.authorized:
            token = "cgp_" + secrets.token_urlsafe(32)  # a new unknown token each time, as a token guesser sends
        head = f"{self.method} {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        if self.payload:
            head += f"Content-Type: application/json\r\nContent-Length: {len(self.payload)}\r\n"
        return (head + "\r\n").encode() + self.payload

    def verdict(self, status: int, body: bytes) -> str | None:
        """What was wrong with this answer, or None."""
        if status != self.status:
            return f"status {status}"
        if self.body is not None and body != self.body:
            return "a different body"
        return None


JSON = Kind("plain JSON", "POST", "/proxy/openai/chat/completions", 200, CHAT, PROMPT)
SSE = Kind("streamed SSE", "GET", "/proxy/openai/sse", 200, SSE_BODY)
UPSTREAM_429 = Kind("upstream 429", "POST", "/proxy/openai/soak/status/429", 429, ERROR_BODIES[429], PROMPT)
UPSTREAM_500 = Kind("upstream 500", "POST", "/proxy/openai/soak/status/500", 500, ERROR_BODIES[500], PROMPT)
STREAMED_429 = Kind("streamed upstream 429", "GET", "/proxy/openai/soak/stream-status/429", 429, ERROR_BODIES[429])
AUTH_FAILURE = Kind("auth failure", "POST", "/proxy/openai/chat/completions", 401, None, PROMPT, authorized=False)
ENDPOINTS = ["POST chat/completions", "GET sse", "* soak/**"]  # what the soak's integration allows


class Connection:
    """One client connection to the gateway, kept alive from request to request."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.closed = False

    @classmethod
    async def open(cls, port: int) -> "Connection":
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        status, headers = await self.read_head()
        body = await self.read_body(headers)
        if headers.get(b"connection") == b"close":
            self.close()
        return status, body

    async def read_head(self) -> tuple[int, dict[bytes, bytes]]:
        lines = (await self.reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers = {}
        for line in filter(None, lines[1:]):
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def read_body(self, headers: dict[bytes, bytes]) -> bytes:
        if b"content-length" in headers:
            return await self.reader.readexactly(int(headers[b"content-length"]))
        if headers.get(b"transfer-encoding") != b"chunked":
            return await self.reader.read()
        parts = []
        while part := await self.read_chunk():
            parts.append(part)
        return b"".join(parts)

    async def read_chunk(self) -> bytes:
        """The next chunk of a chunked body; b"" for the last one (whose trailer is read too)."""
        size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await self.reader.readuntil(b"\r\n")
            return b""
        data = await self.reader.readexactly(size + 2)
        if not data.endswith(b"\r\n"):
            raise UnexpectedReply("broken chunk framing")
        return data[:-2]

    def close(self, *, reset: bool = False) -> None:
        if reset:  # an abortive close: the peer gets RST instead of FIN
            sock = self.writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.close()
        self.closed = True


async def leave_mid_stream(port: int, token: str, stream_id: str, *, reset: bool) -> float:
    """Open an endless stream through the gateway, read three events, leave; returns when it left."""
    connection = await Connection.open(port)
    try:
        connection.writer.write(
            f"GET /proxy/openai/soak/endless/{stream_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\n\r\n".encode()
        )
        status, _ = await connection.read_head()
        if status != 200:
            raise UnexpectedReply(f"status {status}")
        received = b""
        while received.count(b"\n\n") < EVENTS_BEFORE_LEAVING:
            part = await connection.read_chunk()
            if not part:
                raise UnexpectedReply("the endless stream ended")
            received += part
        return time.monotonic()
    finally:
        connection.close(reset=reset)
