"""A stand-in for the third-party providers (the only fake the suite allows): a real HTTP server on a free
port that records exactly what it received and answers like OpenAI or Anthropic, or misbehaves on purpose."""

import asyncio
import contextlib
import gzip
import hashlib
import json
import time
import zlib
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

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

    async def models(request: web.Request) -> web.Response:
        await record(request)  # OpenAI's list of models: what a verification call asks
        listed = {"id": "gpt-4o-mini", "object": "model", "created": 1721172741, "owned_by": "system"}
        return web.json_response({"object": "list", "data": [listed]})

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
    app.router.add_get("/v1/models", models)
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


# The reliability catalogue's upstream modes (FT and LS groups).


@dataclass
class WatchedUpstream:
    """A misbehaving provider at the byte level that also watches the gateway's side of each connection: it
    reads a request head, plays its script (bytes to write, or a float to pause for; an endless iterator
    drips forever), then holds the connection open. `hang_ups` gets the moment the gateway closed each
    connection: the observation point for "the upstream connection is released"."""

    url: str = ""
    asked: list[float] = field(default_factory=list)  # when each request head arrived (time.monotonic)
    hang_ups: list[float] = field(default_factory=list)
    written: int = 0

    @property
    def open_connections(self) -> int:
        return len(self.asked) - len(self.hang_ups)


@asynccontextmanager
async def run_watched_upstream(script: Iterable[bytes | float]) -> AsyncIterator[WatchedUpstream]:
    state = WatchedUpstream()
    writers: set[asyncio.StreamWriter] = set()

    async def perform(writer: asyncio.StreamWriter) -> None:
        for step in script:
            if isinstance(step, bytes):
                writer.write(step)
                await writer.drain()
                state.written += len(step)
            else:
                await asyncio.sleep(step)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        try:
            await reader.readuntil(b"\r\n\r\n")
        except (ConnectionError, asyncio.IncompleteReadError):
            writer.close()
            return
        state.asked.append(time.monotonic())
        performing = asyncio.create_task(perform(writer))
        try:
            while await reader.read(65536):  # a body, then b"" once the gateway hangs up
                pass
        except ConnectionError:
            pass
        state.hang_ups.append(time.monotonic())
        performing.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await performing
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield state
    finally:
        server.close()
        for writer in writers:
            writer.transport.abort()
        await server.wait_closed()


def varied_event(stream: int, index: int, sent_at: float) -> bytes:
    """One event of `/sse-varied`: 10 B to 8 KiB of data, `\\n` or `\\r\\n` line endings, comments between."""
    size = 10 + (stream * 7919 + index * 104729) % (8 * 1024 - 10)
    eol = b"\r\n" if (stream + index) % 2 else b"\n"
    comment = b": keep-alive" + eol if index % 3 == 0 else b""
    data = (b"%d-%d-" % (stream, index)) * (size // 8 + 1)
    return comment + b"id: %d" % index + eol + b"data: at=%.6f " % sent_at + data[:size] + eol + eol


@dataclass
class CatalogueUpstream:
    """State of `run_catalogue_upstream`: what it sent and how many requests it held at once."""

    url: str = ""
    sent: dict[str, str] = field(default_factory=dict)  # `/sse-varied` stream id → SHA-256 of its bytes
    flooded: int = 0  # bytes `/flood` managed to write
    active: int = 0
    peak_active: int = 0
    requests: int = 0
    delay: float = 0.0  # `/slow`'s pause while set (seconds)


ERROR_BODIES: dict[int, object] = {
    429: QUOTA_ERROR,
    500: {"error": {"message": "The server had an error", "type": "server_error", "param": None, "code": None}},
}


def error_body(status: int) -> bytes:
    default = {"error": {"message": f"upstream says {status}", "type": "invalid_request_error", "code": status}}
    return json.dumps(ERROR_BODIES.get(status, default)).encode()


def error_headers(status: int) -> dict[str, str]:
    headers = {"x-request-id": f"req_{status}", "x-ratelimit-limit-requests": "60", "openai-processing-ms": "12"}
    if status in (429, 503):
        headers["retry-after"] = "20"
    return headers


def build_catalogue_app(state: CatalogueUpstream) -> web.Application:
    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        state.requests += 1
        state.active += 1
        state.peak_active = max(state.peak_active, state.active)
        try:
            response: web.StreamResponse = await handler(request)
            return response
        finally:
            state.active -= 1

    async def status(request: web.Request) -> web.StreamResponse:
        """A provider's error (`/status/429`), with its headers; `?chunked=1` frames it without a length."""
        await request.read()
        code = int(request.match_info["code"])
        if request.query.get("chunked") != "1":
            return web.Response(
                status=code, body=error_body(code), headers=error_headers(code), content_type="application/json"
            )
        response = web.StreamResponse(status=code, headers=error_headers(code))
        response.content_type = "application/json"
        await response.prepare(request)
        body = error_body(code)
        await response.write(body[:10])
        await response.write(body[10:])
        await response.write_eof()
        return response

    async def gzipped(request: web.Request) -> web.StreamResponse:
        """`/gzip/<status>`: a gzip-encoded JSON body; `?sse=1`: a gzip-encoded event stream, flushed per event."""
        code = int(request.match_info["code"])
        if request.query.get("sse") != "1":
            return web.Response(
                status=code,
                # mtime fixed: the same body compressed in another second must be the same bytes
                body=gzip.compress(error_body(code) if code >= 400 else b'{"compressed": true}', mtime=0),
                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
            )
        response = web.StreamResponse(
            status=code, headers={"Content-Encoding": "gzip", "Content-Type": "text/event-stream"}
        )
        await response.prepare(request)
        compressor = zlib.compressobj(wbits=31)  # gzip framing
        for event in GZIP_EVENTS:
            await response.write(compressor.compress(event) + compressor.flush(zlib.Z_SYNC_FLUSH))
            await asyncio.sleep(0.01)
        await response.write(compressor.flush())
        await response.write_eof()
        return response

    async def sse_varied(request: web.Request) -> web.StreamResponse:
        stream = int(request.query["id"])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        digest = hashlib.sha256()
        for index in range(int(request.query.get("n", "20"))):
            event = varied_event(stream, index, time.monotonic())
            digest.update(event)
            await response.write(event)
            await asyncio.sleep(float(request.query.get("delay", "0.05")))
        state.sent[str(stream)] = digest.hexdigest()
        await response.write_eof()
        return response

    async def flood(request: web.Request) -> web.StreamResponse:
        """`/flood?mib=N`: N MiB as fast as the reader takes them (aiohttp waits while its buffer is full)."""
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        piece = b"f" * 65536
        for _ in range(int(request.query.get("mib", "1")) * 16):
            await response.write(piece)
            state.flooded += len(piece)
        await response.write_eof()
        return response

    async def sha256(request: web.Request) -> web.Response:
        """The SHA-256 and length of the request body, read as it streams in (never held whole)."""
        digest, length = hashlib.sha256(), 0
        async for chunk in request.content.iter_any():
            digest.update(chunk)
            length += len(chunk)
        return web.json_response({"sha256": digest.hexdigest(), "bytes": length})

    async def slow(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(state.delay)
        return web.json_response({"slow": state.delay})

    app = web.Application(middlewares=[count], client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/status/{code:\\d{3}}", status)
    app.router.add_get("/gzip/{code:\\d{3}}", gzipped)
    app.router.add_get("/sse-varied", sse_varied)
    app.router.add_get("/flood", flood)
    app.router.add_post("/sha256", sha256)
    app.router.add_route("*", "/slow", slow)
    return app


GZIP_EVENTS = [f'data: {{"n": {index}}}\n\n'.encode() for index in range(5)] + [b"data: [DONE]\n\n"]


@asynccontextmanager
async def run_catalogue_upstream() -> AsyncIterator[CatalogueUpstream]:
    state = CatalogueUpstream()
    # A handler stops when its client leaves, as a provider stops generating: `active` counts connections.
    runner = web.AppRunner(build_catalogue_app(state), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        await runner.cleanup()


@dataclass
class TokenEndpoint:
    """An OAuth 2.0 token endpoint that answers as told: a token (`lifetime` seconds), a status, a body that
    is not JSON, or nothing at all (`hang`). `calls` counts the requests it got."""

    url: str = ""
    calls: int = 0
    lifetime: int = 3600
    status: int = 200
    malformed: bool = False
    hang: bool = False


@asynccontextmanager
async def run_token_endpoint() -> AsyncIterator[TokenEndpoint]:
    state = TokenEndpoint()

    async def issue(request: web.Request) -> web.Response:
        await request.read()
        state.calls += 1
        if state.hang:
            await asyncio.sleep(3600)
        if state.malformed:
            return web.Response(body=b'{"access_token": ', content_type="application/json")
        if state.status != 200:
            return web.json_response({"error": "server_error"}, status=state.status)
        token = {"access_token": f"access-{state.calls}", "token_type": "Bearer", "expires_in": state.lifetime}
        return web.json_response(token)

    app = web.Application()
    app.router.add_post("/oauth/token", issue)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}/oauth/token"
    try:
        yield state
    finally:
        await runner.cleanup()


@dataclass
class FaultRelay:
    """A TCP relay in front of a service (the database) that can refuse, hang or pass: the catalogue's fault
    proxy. `refuse()` resets every open connection and every new one; `hang()` stops moving bytes on every
    connection, open or new, without closing any; `restore()` passes bytes again (on new connections)."""

    port: int = 0
    mode: str = "pass"
    connections: set[asyncio.StreamWriter] = field(default_factory=set)
    flowing: asyncio.Event = field(default_factory=asyncio.Event)

    def refuse(self) -> None:
        self.mode = "refuse"
        self.flowing.set()
        for writer in list(self.connections):
            writer.transport.abort()

    def hang(self) -> None:
        self.mode = "hang"
        self.flowing.clear()

    def restore(self) -> None:
        self.mode = "pass"
        self.flowing.set()


@asynccontextmanager
async def run_fault_relay(host: str, port: int) -> AsyncIterator[FaultRelay]:
    state = FaultRelay()
    state.flowing.set()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                await state.flowing.wait()
                if state.mode == "refuse":
                    break
                writer.write(data)
                await writer.drain()
        writer.transport.abort()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if state.mode == "refuse":
            writer.transport.abort()
            return
        try:
            target_reader, target_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.transport.abort()
            return
        state.connections.update((writer, target_writer))
        try:
            await asyncio.gather(pump(reader, target_writer), pump(target_reader, writer))
        finally:
            state.connections.difference_update((writer, target_writer))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        server.close()
        state.refuse()
        await server.wait_closed()


@dataclass
class KeyJudge:
    """A stand-in provider that answers by the key it is called with, and records each call's key and body."""

    url: str = ""
    answers: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    calls: list[tuple[str, bytes]] = field(default_factory=list)

    def keys_called(self) -> list[str]:
        return [key for key, _ in self.calls]


@asynccontextmanager
async def run_key_judge() -> AsyncIterator[KeyJudge]:
    state = KeyJudge()

    async def answer(request: web.Request) -> web.Response:
        key = request.headers.get("Authorization", "").removeprefix("Bearer ")
        state.calls.append((key, await request.read()))
        status, headers = state.answers.get(key, (200, {}))
        body = {"error": {"message": "no"}} if status >= 400 else {"ok": True, "key_hint": key[-4:]}
        return web.json_response(body, status=status, headers=headers)

    app = web.Application(client_max_size=16 * 1024 * 1024)  # a body too large for failover (4 MiB) fits
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        await runner.cleanup()


@dataclass
class WebhookReceiver:
    """A stand-in for an admin's webhook endpoint: answers each post with the next of `statuses` (then 200) and
    records what it received, headers and exact body."""

    url: str = ""
    statuses: list[int] = field(default_factory=list)
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    answered: list[int] = field(default_factory=list)

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.received]

    async def wait_for(self, count: int, seconds: float = 10) -> None:
        for _ in range(int(seconds / 0.02)):
            if len(self.received) >= count:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{len(self.received)} posts received, not {count}")


@asynccontextmanager
async def run_webhook_receiver() -> AsyncIterator[WebhookReceiver]:
    state = WebhookReceiver()

    async def receive(request: web.Request) -> web.Response:
        state.received.append((dict(request.headers), await request.read()))
        status = state.statuses.pop(0) if state.statuses else 200
        state.answered.append(status)
        return web.Response(status=status, text="ok" if status < 300 else "not now")

    app = web.Application()
    app.router.add_post("/hooks/credgate", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}/hooks/credgate"
    try:
        yield state
    finally:
        await runner.cleanup()
