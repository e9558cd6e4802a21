"""How the gateway's HTTP protocol writes responses to a connection: a response whole at once in one call, a lone
response at once, the responses of a busy turn at its end, nothing written out of order, and a refusal after the
responses before it."""

import asyncio
import gc
import logging
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

    def __init__(self, fails: bool = False) -> None:
        super().__init__()
        self.calls: list[bytes] = []
        self.closing = False
        self.closed_after: int | None = None  # the writes before close()
        self.fails = fails

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.fails:
            raise RuntimeError("broken transport")
        self.calls.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closed_after = len(self.calls)
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


def connect(
    app: Callable[..., Awaitable[None]], *, fails: bool = False, **settings: Any
) -> tuple[Any, RecordingTransport]:
    config = server_config(app, Settings(**settings))
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})  # type: ignore[call-arg]
    transport = RecordingTransport(fails)
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


async def test_a_busy_turns_first_response_is_written_at_once_the_others_at_its_end_each_in_one_call(
    tmp_path: Any,
) -> None:
    """Several connections answered in one turn: the first at once, the others together at the turn's end (their
    writes one after the other, not each between other requests' code), each whole."""
    release = asyncio.Event()
    seen_after_last_send: list[int] = []

    def app_of(transport: list[RecordingTransport]) -> Callable[..., Awaitable[None]]:
        async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            seen_after_last_send.append(len(transport[0].calls))

        return app

    connections = []
    for _ in range(3):
        own: list[RecordingTransport] = []
        protocol, transport = connect(app_of(own), data_dir=tmp_path)
        own.append(transport)
        connections.append((protocol, transport))
    for protocol, _ in connections:
        protocol.data_received(GET)
    await settle()
    release.set()  # all three wake in the same turn
    await settle()
    assert seen_after_last_send == [1, 0, 0]
    for _, transport in connections:
        assert len(transport.calls) == 1
        assert transport.calls[0].endswith(b"\r\n\r\nok")


async def test_one_broken_connection_does_not_keep_the_others_responses_back(tmp_path: Any, caplog: Any) -> None:
    """Two responses under way wait for the turn's end; the first connection's transport fails: the second's bytes
    still go, and the failure is logged."""
    finish = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"ok", "more_body": True})
        await finish.wait()
        await send({"type": "http.response.body", "body": b"ok"})

    caplog.set_level(logging.ERROR, logger="credgate.server")
    broken = connect(app, fails=True, data_dir=tmp_path)
    sound = connect(app, data_dir=tmp_path)
    for protocol, _ in (broken, sound):
        protocol.data_received(GET)
    await settle()
    assert sound[1].calls == [b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nok"]
    assert "could not write to a client connection" in caplog.text
    for protocol, _ in (broken, sound):
        protocol.connection_lost(None)
    finish.set()
    await settle()


async def test_what_a_connection_closed_meanwhile_held_is_dropped_and_a_close_writes_first(tmp_path: Any) -> None:
    """A client that stopped reading (its connection aborted) gets nothing more and raises nothing; a response
    that ends its connection (HTTP/1.0) is written whole before the connection closes."""
    go_on = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await go_on.wait()
        await send({"type": "http.response.body", "body": b"ok"})

    protocol, aborted = connect(app, data_dir=tmp_path)
    protocol.data_received(GET)
    await asyncio.sleep(0)  # its head waits for the turn's end
    aborted.abort()
    await settle()
    assert aborted.calls == []

    protocol, closed = connect(app, data_dir=tmp_path)
    protocol.data_received(b"GET /x HTTP/1.0\r\n\r\n")
    await settle()
    go_on.set()
    await settle()
    assert b"".join(closed.calls).endswith(b"\r\n\r\nok")
    assert closed.closed_after == len(closed.calls)


async def test_a_response_writing_much_in_one_turn_meets_flow_control_as_it_goes(tmp_path: Any) -> None:
    """Past 64 KiB held, the bytes go at once: a client that reads slowly pauses the writer before a response
    that writes much without yielding (an export) has all of it in memory."""
    seen: list[int] = []
    transport: RecordingTransport | None = None

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(100):
            await send({"type": "http.response.body", "body": b"x" * 1024, "more_body": True})
        assert transport is not None
        seen.append(sum(map(len, transport.calls)))
        await send({"type": "http.response.body", "body": b""})

    protocol, transport = connect(app, data_dir=tmp_path)
    protocol.data_received(GET)
    await settle()
    assert 64 * 1024 < seen[0] < 100 * 1024


async def test_a_refused_pipelined_head_is_answered_after_the_responses_under_way_each_whole(tmp_path: Any) -> None:
    """A head over the limit, pipelined behind a response still streaming and a request waiting its turn: both
    are answered whole, then the 431, then the connection ends; nothing is interleaved."""
    go_on = asyncio.Event()
    served: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        served.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"ab", "more_body": True})
        await go_on.wait()
        await send({"type": "http.response.body", "body": b"cd"})

    protocol, transport = connect(app, data_dir=tmp_path, max_header_bytes=1024)
    protocol.data_received(GET)
    await settle()  # the first response has started
    protocol.data_received(b"GET /y HTTP/1.1\r\nHost: gateway\r\n\r\nGET /z HTTP/1.1\r\nX-Big: " + b"a" * 2048)
    await settle()
    assert not any(b" 431 " in call for call in transport.calls)
    go_on.set()
    await settle()
    written = b"".join(transport.calls)
    first, second, refusal = written.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 OK")
    assert first.endswith(b"\r\n\r\nabcd")
    assert second.startswith(b"200 OK")
    assert second.endswith(b"\r\n\r\nabcd")
    assert refusal.startswith(b"431 Request Header Fields Too Large\r\n")
    assert served == ["/x", "/y"]


async def test_a_malformed_body_is_refused_at_once_ending_its_response(tmp_path: Any) -> None:
    """Broken framing within a request's own body is that request's answer: 400 now, with the right reason."""

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    protocol, transport = connect(app, data_dir=tmp_path)
    protocol.data_received(b"POST /x HTTP/1.1\r\nHost: gateway\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    await settle()
    assert b"".join(transport.calls).startswith(b"HTTP/1.1 400 Bad Request\r\n")
    protocol.connection_lost(None)  # the app hears the client leave, and ends
    await settle()


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
