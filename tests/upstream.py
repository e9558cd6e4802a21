"""A stand-in for the third-party providers (the only fake the suite allows): a real HTTP server on a free
port that records exactly what it received and answers like OpenAI or Anthropic, or misbehaves on purpose."""

import asyncio
import gzip
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

QUOTA_ERROR = {
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
}


@dataclass(frozen=True)
class Received:
    method: str
    path_qs: str  # exactly as it arrived on the wire
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = [value for key, value in self.headers if key.lower() == name.lower()]
        return values[0] if values else None

    def header_names(self) -> set[str]:
        return {key.lower() for key, _ in self.headers}


@dataclass
class Upstream:
    url: str = ""
    received: list[Received] = field(default_factory=list)
    open_streams: int = 0  # responses being written right now

    @property
    def last(self) -> Received:
        return self.received[-1]


def chat_completion(model: str) -> dict[str, object]:
    return {
        "id": "chatcmpl-123",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
    }


def _sse(data: object) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def build_app(state: Upstream) -> web.Application:
    async def record(request: web.Request) -> Received:
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in request.raw_headers]
        received = Received(request.method, request.raw_path, headers, await request.read())
        state.received.append(received)
        return received

    async def chat(request: web.Request) -> web.StreamResponse:
        body = json.loads((await record(request)).body)
        if not body.get("stream"):
            return web.json_response(chat_completion(body["model"]), headers={"x-request-id": "req_upstream"})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        state.open_streams += 1
        try:
            for index, word in enumerate(["Hel", "lo", "!"]):
                chunk = {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": body["model"],
                    "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
                }
                await response.write(_sse(chunk))
                await asyncio.sleep(float(request.query.get("delay", "0.05")) if index < 2 else 0)
            if body.get("stream_options", {}).get("include_usage"):
                await response.write(
                    _sse(
                        {
                            "id": "c1",
                            "object": "chat.completion.chunk",
                            "created": 1,
                            "model": body["model"],
                            "choices": [],
                            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
                        }
                    )
                )
            await response.write(b"data: [DONE]\n\n")
        finally:
            state.open_streams -= 1
        return response

    async def messages(request: web.Request) -> web.StreamResponse:
        body = json.loads((await record(request)).body)
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": "Hi!"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 7, "output_tokens": 2},
        }
        if not body.get("stream"):
            return web.json_response(message)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        start = message | {"content": [], "usage": {"input_tokens": 7, "output_tokens": 0}}
        events = [
            ("message_start", {"type": "message_start", "message": start}),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi!"}},
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 2},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        for name, data in events:
            await response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        return response

    async def images(request: web.Request) -> web.Response:
        await record(request)
        return web.json_response({"created": 1, "data": [{"url": "https://images.test/1.png"}]})

    async def quota(request: web.Request) -> web.Response:
        await record(request)
        return web.json_response(
            QUOTA_ERROR, status=429, headers={"x-ratelimit-limit-requests": "60", "retry-after": "20"}
        )

    async def echo(request: web.Request) -> web.Response:
        received = await record(request)
        return web.json_response(
            {
                "method": received.method,
                "path_qs": received.path_qs,
                "headers": received.headers,
                "body_length": len(received.body),
            }
        )

    async def gzipped(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(
            body=gzip.compress(b'{"compressed": true}'),
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )

    async def binary(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(body=bytes(range(256)) * 4096, content_type="audio/mpeg")

    async def slow(request: web.Request) -> web.Response:
        await record(request)
        await asyncio.sleep(float(request.query.get("seconds", "5")))
        return web.json_response({"slow": True})

    async def sse(request: web.Request) -> web.StreamResponse:
        await record(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        state.open_streams += 1
        try:
            for index in range(int(request.query.get("n", "5"))):
                await response.write(f'data: {{"n": {index}, "at": {time.monotonic()}}}\n\n'.encode())
                await asyncio.sleep(float(request.query.get("delay", "0.2")))
        finally:
            state.open_streams -= 1
        return response

    async def broken(request: web.Request) -> web.StreamResponse:
        await record(request)
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "1000"})
        await response.prepare(request)
        await response.write(b'{"partial": ')
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()  # dies mid-body
        return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/images/generations", images)
    app.router.add_route("*", "/quota/{tail:.*}", quota)
    app.router.add_route("*", "/echo/{tail:.*}", echo)
    app.router.add_get("/gzip", gzipped)
    app.router.add_get("/binary", binary)
    app.router.add_route("*", "/slow", slow)
    app.router.add_get("/sse", sse)
    app.router.add_get("/broken", broken)
    return app


@asynccontextmanager
async def run_upstream() -> AsyncIterator[Upstream]:
    state = Upstream()
    runner = web.AppRunner(build_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()


@dataclass
class RawUpstream:
    """A misbehaving provider at the byte level: each connection reads a request head, then plays `script`
    (bytes to write, or a float to pause for), then closes (or aborts with a reset when `reset` is set)."""

    url: str = ""
    connections: int = 0
    open_connections: int = 0
    heads: list[bytes] = field(default_factory=list)


@asynccontextmanager
async def run_raw_upstream(script: list[bytes | float], *, reset: bool = False) -> AsyncIterator[RawUpstream]:
    state = RawUpstream()

    async def play(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        state.open_connections += 1
        try:
            state.heads.append(await reader.readuntil(b"\r\n\r\n"))
            for step in script:
                if isinstance(step, bytes):
                    writer.write(step)
                    await writer.drain()
                else:
                    await asyncio.sleep(step)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            state.open_connections -= 1
            if reset:
                writer.transport.abort()
            else:
                writer.close()

    server = await asyncio.start_server(play, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield state
    finally:
        server.close()
        await server.wait_closed()
