"""How the gateway's HTTP protocol writes responses to a connection: a response whole at once in one call, a lone
response at once, the responses of a busy turn at its end, and nothing written out of order."""

import asyncio
import gc
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from uvicorn.server import ServerState

from credgate.config import Settings
from credgate.server import server_config

Send = Callable[[dict[str, Any]], Awaitable[None]]
GET = b"GET /x HTTP/1.1\r\nHost: gateway\r\n\r\n"


class RecordingTransport(asyncio.Transport):
    """A client connection that records each call that writes to it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[bytes] = []
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.calls.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.calls.append(b"".join(list_of_data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 8000) if name in ("sockname", "peername") else default


def connect(app: Callable[..., Awaitable[None]], **settings: Any) -> tuple[Any, RecordingTransport]:
    config = server_config(app, Settings(**settings))
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})  # type: ignore[call-arg]
    transport = RecordingTransport()
    protocol.connection_made(transport)
    return protocol, transport


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_response_whole_at_once_is_one_write_written_before_its_request_goes_on(tmp_path: Any) -> None:
    """uvicorn writes a head apart from its body; the client gets both in one call (one packet), and a lone
    response's bytes are on their way before the code after its last send runs (the request's bookkeeping)."""
    seen_after_last_send: list[int] = []
    transport: RecordingTransport | None = None

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
        assert transport is not None
        seen_after_last_send.append(len(transport.calls))

    protocol, transport = connect(app, data_dir=tmp_path)
    protocol.data_received(GET)
    await settle()
    assert len(transport.calls) == 1
    assert transport.calls[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.calls[0].endswith(b"\r\n\r\nok")
    assert seen_after_last_send == [1]


async def test_a_head_whose_body_is_still_to_come_is_written_at_the_end_of_its_turn(tmp_path: Any) -> None:
    """A stream's head goes out without waiting for its first event."""
    go_on = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await go_on.wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: 2\n\n"})

    protocol, transport = connect(app, data_dir=tmp_path)
    protocol.data_received(GET)
    await settle()
    assert len(transport.calls) == 1
    assert transport.calls[0].startswith(b"HTTP/1.1 200 OK\r\n")
    go_on.set()
    await settle()
    # One turn's two events in one call, chunked as uvicorn frames them, the stream's end with them.
    assert transport.calls[1:] == [b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"]


async def test_the_responses_of_a_busy_turn_are_each_written_in_one_call(tmp_path: Any) -> None:
    """Several connections answered in one turn: the first at once, the others at its end, each whole."""
    release = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    connections = [connect(app, data_dir=tmp_path) for _ in range(3)]
    for protocol, _ in connections:
        protocol.data_received(GET)
    await settle()
    release.set()  # all three wake in the same turn
    await settle()
    for _, transport in connections:
        assert len(transport.calls) == 1
        assert transport.calls[0].endswith(b"\r\n\r\nok")


async def test_a_refused_pipelined_request_is_answered_after_the_response_before_it(tmp_path: Any) -> None:
    """The 431 of a pipelined request over the header limit follows the bytes of the response under way, never
    precedes them; what that response writes afterwards is dropped (the connection closes)."""
    go_on = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"ab", "more_body": True})
        await go_on.wait()
        await send({"type": "http.response.body", "body": b"cd"})

    protocol, transport = connect(app, data_dir=tmp_path, max_header_bytes=1024)
    protocol.data_received(GET)
    await asyncio.sleep(0)  # the response's task has run: its head and first bytes wait for the turn's end
    protocol.data_received(b"GET /y HTTP/1.1\r\nX-Big: " + b"a" * 2048 + b"\r\n\r\n")
    go_on.set()
    await settle()
    written = b"".join(transport.calls)
    assert written.startswith(b"HTTP/1.1 200 OK\r\n")
    _response, refusal = written.split(b"\r\n\r\nab", 1)
    assert refusal.startswith(b"HTTP/1.1 431 ")
    assert b"cd" not in refusal


def test_an_event_loop_that_served_a_connection_is_freed_once_closed(tmp_path: Any) -> None:
    """The writes waiting for a loop's turn are kept per loop; that keeping must not hold the loop itself."""

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def serve_one() -> None:
        protocol, transport = connect(app, data_dir=tmp_path)
        protocol.data_received(GET)
        await settle()
        assert transport.calls
        protocol.connection_lost(None)

    loop = asyncio.new_event_loop()
    loop.run_until_complete(serve_one())
    loop.close()
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None
