"""The HTTP server: uvicorn as credgate runs it, with a bounded request head.

uvicorn's httptools protocol reads a request line and headers of any size, and waits for them forever. Here the
head is bounded where its bytes arrive, before the parser buffers them: over `max_header_bytes` or
`MAX_HEADER_COUNT` headers the client gets 431; a head not complete within `head_timeout_seconds` gets 408. In
both cases the connection closes, so memory per connection stays bounded whatever a client sends. The other way,
a client that stops reading holds its response (and, through flow control, the upstream's) for at most
`send_timeout_seconds`, then its connection is closed. What a connection's responses write in one event-loop turn
leaves in one system call at the turn's end (`_JoinedWrites`).

With `workers` above 1, the parent binds and listens on a socket for each worker, all on one port (on Linux,
where SO_REUSEPORT spreads connections among them), and uvicorn's supervisor runs that many worker processes, each
on its own (see `run_workers`): each runs the whole gateway, attached to the database the parent checked and
migrated.
"""

import asyncio
import contextvars
import importlib.machinery
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http import HTTPStatus
from typing import Any, NamedTuple

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from credgate import metrics
from credgate.config import Settings
from credgate.error_responses import ERROR_HEADER, error_body
from credgate.errors import StartupError
from credgate.log_format import CredgateHandler, formatter, quiet_chatty_loggers
from credgate.services.bootstrap import attach_context
from credgate.services.context import Context

logger = logging.getLogger("credgate.server")
MAX_HEADER_COUNT = 100  # as Envoy's default: SDKs send about 15, browsers about 25
LINGER_SECONDS = 1.0
# The process id tells which worker wrote a line; the level stays right before the logger's name.
WORKER_HEALTHCHECK_SECONDS = 10  # a worker that does not answer the supervisor's ping for this long is replaced
# An idle client connection is closed after this; a front proxy keeping idle connections to credgate must drop
# them sooner, or it may send a request on one credgate is closing (docs/deploy/nginx.conf: 4 s).
KEEP_ALIVE_SECONDS = 5
BACKLOG = 2048  # connections waiting to be accepted: the same for the early listen() and uvicorn's own
# What a connection's response may hold for the end of the turn: past it, written at once, so that a response
# writing much in one turn meets the transport's flow control (64 KiB) as it did written piece by piece.
MAX_HELD_BYTES = 65536
WORKER_EXIT_MARGIN_SECONDS = 5.0  # after the drain, for a worker's shutdown (closing its pools) before it is killed

GatewayFactory = Callable[..., ASGIApp]
"""`create_app` (settings, *, context): a module-level function, so that it pickles into worker processes."""


class _HeadRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message


class _Timer:
    """A callback armed for later, at most once at a time. It holds the callback only while armed: a protocol's
    bound method kept here for good would make protocol and timer a cycle, which only the collector's rare full
    pass frees, so every closed connection's memory would linger (bench/soak.py's FT-07 grew 3 KB a connection)."""

    __slots__ = ("_delay", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        self._loop, self._delay = loop, delay
        self._handle: asyncio.TimerHandle | None = None

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def arm(self, callback: Callable[[], None]) -> None:
        """Call `callback` `delay` seconds from now, in place of any earlier arming."""
        self.cancel()
        self._handle = self._loop.call_later(self._delay, self._fire, callback)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self, callback: Callable[[], None]) -> None:
        self._handle = None
        callback()


class _Turn:
    """The connections of one event loop whose writes wait for the end of the loop's turn, all written then, one
    after the other. It holds no reference to its loop: a loop's entry in `_turns` goes with the loop."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: list[_JoinedWrites] = []

    def hold(self, writes: "_JoinedWrites", loop: asyncio.AbstractEventLoop) -> None:
        if not self.waiting:
            # In a context of its own: not that of the request that happened to write first.
            loop.call_soon(self._flush, context=contextvars.Context())
        self.waiting.append(writes)

    def _flush(self) -> None:
        waiting, self.waiting = self.waiting, []
        for writes in waiting:
            try:
                writes.flush()
            except Exception:  # one connection's broken transport must not keep the others' bytes back
                logger.exception("could not write to a client connection")


_turns: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turn]" = weakref.WeakKeyDictionary()


class _JoinedWrites(asyncio.Transport):
    """A connection's transport as its responses write to it. uvicorn writes a response's head apart from its
    body: an answer whole at once (a JSON body, an error) left as two packets, each a system call and a pass through
    the TCP stack of both ends. Here what a connection writes waits for the end of the event-loop turn, and leaves
    in one call; the writes of all the connections of a busy turn then follow each other, not each between other
    requests' Python code. Together, a worker serves 12 to 24% more requests at 64 connections (README, Performance)."""

    __slots__ = ("_ended", "_held", "_held_bytes", "_loop", "_transport", "_turn")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport, self._loop = transport, loop
        self._turn = _turns.get(loop) or _turns.setdefault(loop, _Turn())
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._ended = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._ended:
            return
        if not self._held:
            self._turn.hold(self, self._loop)
        self._held.append(bytes(data))
        self._held_bytes += len(data)
        if self._held_bytes > MAX_HELD_BYTES:
            self.flush()

    def flush(self) -> None:
        held = self._held
        if not held:
            return
        self._held, self._held_bytes = [], 0
        if self._transport.is_closing():  # aborted (a client that stopped reading), or closed: nothing more goes
            return
        if len(held) == 1:
            self._transport.write(held[0])
        else:
            self._transport.writelines(held)

    def response_complete(self) -> None:
        """A response is whole: written now if no other connection has written this turn (a lone request's answer
        does not wait for the bookkeeping that follows it), else at the turn's end with the others."""
        if len(self._turn.waiting) <= 1:
            self.flush()

    def end(self) -> None:
        """What was written goes now; what a response writes after that is dropped (the connection's last answer
        is the server's own)."""
        self.flush()
        self._ended = True

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


class BoundedHttpProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that counts the bytes and headers of each request head as they arrive, and closes a
    connection whose response waits `send_timeout_seconds` for its client to read it."""

    max_header_bytes = 65536
    head_timeout_seconds = 10.0
    send_timeout_seconds = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes: int | None = 0  # None once the head is complete: the bytes that follow are body
        self._refusal: _HeadRefused | None = None
        self._refusal_waiting: tuple[int, str] | None = None  # for the responses under way to complete
        self._discarding = False
        self._draining = False  # the server is stopping: every response is the connection's last
        self._head_timer = _Timer(self.loop, self.head_timeout_seconds)
        self._send_timer = _Timer(self.loop, self.send_timeout_seconds)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._writes = _JoinedWrites(transport, self.loop)
        self._head_timer.arm(self._head_timed_out)  # a connection that never sends a byte is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_timer.cancel()
        self._send_timer.cancel()
        super().connection_lost(exc)

    # The transport pauses the writer while more than its high-water mark (64 KiB) waits for the client, and
    # resumes it once the client has read all but 16 KiB; a timer runs only while paused, so it costs nothing
    # otherwise. A client reading 48 KiB within the timeout (under 1 KiB/s at 60 s) is never cut.
    def pause_writing(self) -> None:
        super().pause_writing()
        if not self._send_timer.armed:
            self._send_timer.arm(self._send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._send_timer.cancel()

    def _send_timed_out(self) -> None:
        logger.warning(
            "closed the connection of %s: its response waited %g s for the client to read it",
            _peer(self.client),
            self.send_timeout_seconds,
        )
        self.transport.abort()  # what waits in the buffer will never be read: drop it, and the request ends

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        try:
            self._receive(data)
        except _HeadRefused as refusal:
            self._refuse(refusal.status, refusal.message)

    def _receive(self, data: bytes) -> None:
        if self._head_bytes is None or not data:
            super().data_received(data)
            return
        starting = self._head_bytes == 0
        self._head_bytes += len(data)
        excess = self._head_bytes - self.max_header_bytes
        if excess <= 0:
            super().data_received(data)
            if starting and self._head_bytes:
                # The head goes on past these bytes: its time runs from now. One that came whole (nearly every
                # one) arms no timer: arming and cancelling one a request was about 1% of its instructions.
                self._head_timer.arm(self._head_timed_out)
            return
        # The head may still end within the allowed part (the rest being body, or the next request): feed that
        # part alone, and refuse only if the head is still open after it.
        allowed = len(data) - excess
        super().data_received(data[:allowed])
        if self._head_bytes is not None and not self.transport.is_closing():
            raise _HeadRefused(431, f"request line and headers over the limit of {self.max_header_bytes} bytes")
        self._receive(data[allowed:])

    def on_header(self, name: bytes, value: bytes) -> None:
        """uvicorn's own on_header (tests/test_server.py checks it is still that), with the count: one call a
        header rather than two, for the dozen an SDK sends."""
        headers = self.headers  # uvicorn's, new for each request
        if len(headers) >= MAX_HEADER_COUNT:
            # httptools turns an exception in a callback into a parser error, which uvicorn answers with a bare
            # 400: keep the reason, so that send_400_response can answer 431 instead.
            self._refusal = _HeadRefused(431, f"more than {MAX_HEADER_COUNT} request headers")
            raise self._refusal
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        headers.append((name, value))

    def send_400_response(self, msg: str) -> None:
        if self._refusal is not None:
            self._refuse(self._refusal.status, self._refusal.message)
        else:
            self._refuse(400, "malformed HTTP request")

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._head_timer.cancel()
        super().on_headers_complete()
        if self.cycle is None:  # a WebSocket's upgrade: no HTTP response here
            return
        self.cycle.transport = self._writes  # its response is written through the connection's joined writes
        if self._draining:
            self.cycle.keep_alive = False  # answered with Connection: close, then the connection ends

    def handle_websocket_upgrade(self) -> None:
        self._writes.flush()  # an earlier response's bytes go before what the WebSocket's protocol writes
        super().handle_websocket_upgrade()

    def shutdown(self) -> None:
        """The server stops (SIGTERM). uvicorn closes an idle kept-alive connection at once, but a front proxy may
        be sending a request on it at that very moment, and would not resend a POST: its client would get 502.
        Here an idle connection stays open: a request that still comes on it is served with Connection: close,
        and one that does not ends at the keep-alive timeout, after the front proxy has dropped it (nginx: 4 s)."""
        self._draining = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False

    def on_response_complete(self) -> None:
        self._writes.response_complete()
        super().on_response_complete()
        # Answered once the last response is complete, unless that response ended the connection (Connection:
        # close, a stop).
        refusal, cycle = self._refusal_waiting, self.cycle
        if refusal is not None and cycle is not None and cycle.response_complete and not self.transport.is_closing():
            self._answer_refusal(*refusal)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_bytes = 0  # what arrives next is the next request's head

    def _head_timed_out(self) -> None:
        if self._head_bytes is not None and not self.transport.is_closing():
            self._refuse(408, "the request head was not sent in time")

    def _refuse(self, status: int, message: str) -> None:
        """Answer in the service-error shape and close: the rest of this connection cannot be trusted. A head
        refused behind requests whose responses are under way (pipelined) is answered after them, so that the
        client can still read each; one refused within a request (its body) ends that request's response."""
        self._head_timer.cancel()
        # What the client sends from now on is read and dropped, never kept: a lingering close follows the answer.
        self._discarding = True
        # A head (not a body) while the last request's response is not complete: the head of a pipelined request.
        behind = self._head_bytes is not None and self.cycle is not None and not self.cycle.response_complete
        self._head_bytes = None
        if behind:
            self._refusal_waiting = (status, message)
        else:
            self._answer_refusal(status, message)

    def _answer_refusal(self, status: int, message: str) -> None:
        self._refusal_waiting = None
        self._writes.end()  # what a response wrote goes first; anything it writes later, never
        request_id = secrets.token_hex(8)
        logger.warning("%d from %s: %s (request id %s)", status, _peer(self.client), message, request_id)
        body = error_body(status, message)
        head = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            f"{ERROR_HEADER}: true",
            f"x-credgate-request-id: {request_id}",
            f"x-request-id: {request_id}",
            "connection: close",
        ]
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        # A lingering close: a client still sending its head would otherwise get a reset that can destroy the
        # answer before it reads it.
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "unknown client"


def exit_zero_on_sigterm() -> None:
    """uvicorn drains on SIGTERM, then raises the signal again once its old handler is back, so the process
    would die by it; a drained gateway exits 0 (what an orchestrator expects of a clean stop)."""
    signal.signal(signal.SIGTERM, lambda _signal, _frame: None)


def configure_logging(settings: Settings) -> None:
    # What no line shows is not collected (the logging HOWTO's "Optimization"): callers' source lines, threads.
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    handler = CredgateHandler()
    handler.setFormatter(formatter(settings.log_format))
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler])
    quiet_chatty_loggers(logging.getLogger().level)


def server_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn's configuration for the gateway: credgate logs for itself and bounds every request head."""
    return uvicorn.Config(app, **(_options(settings) | overrides))


def _options(settings: Settings) -> dict[str, Any]:
    protocol = type(
        "GatewayHttpProtocol",
        (BoundedHttpProtocol,),
        {
            "max_header_bytes": settings.max_header_bytes,
            "head_timeout_seconds": settings.header_timeout_seconds,
            "send_timeout_seconds": settings.send_timeout_seconds,
        },
    )
    return {
        "host": settings.host,
        "port": settings.port,
        "http": protocol,
        "access_log": False,
        "server_header": False,
        "proxy_headers": False,  # the control plane reads X-Forwarded-For itself (create_app)
        "date_header": False,
        "log_config": None,
        "timeout_graceful_shutdown": settings.drain_seconds,
        "timeout_keep_alive": KEEP_ALIVE_SECONDS,
        "backlog": BACKLOG,
    }


class Listeners(NamedTuple):
    """What the gateway listens on: each worker's main listener (`main[i]` is worker i's), and the admin listener
    when one is configured, which every worker shares (it carries little)."""

    main: list[socket.socket]
    admin: socket.socket | None

    def of_worker(self, index: int) -> list[socket.socket]:
        return [self.main[index], *([] if self.admin is None else [self.admin])]

    def all(self) -> list[socket.socket]:
        """Every socket once (the main one is the same for every worker where the system has no SO_REUSEPORT)."""
        return list(dict.fromkeys([*self.main, *([] if self.admin is None else [self.admin])]))


def bind_listeners(settings: Settings) -> Listeners:
    """The main listening sockets, one a worker, and the admin listener's when one is configured (StartupError if
    they cannot be)."""
    admin = settings.admin_listener
    if admin is not None and admin[1] == settings.port:
        raise StartupError(f"the admin listener needs a port of its own: port {settings.port} is the main listener's")
    if settings.workers > 1 and sys.platform == "linux":
        main = _bind_each_worker(settings.host, settings.port, settings.workers)
    else:  # elsewhere SO_REUSEPORT does not spread connections: the workers share one socket
        main = [_bind(settings.host, settings.port)] * settings.workers
    return Listeners(main, None if admin is None else _bind(*admin))


def _bind_each_worker(host: str, port: int, workers: int) -> list[socket.socket]:
    """A socket for each worker on one port (SO_REUSEPORT), among which the kernel spreads new connections by
    their addresses. On one shared socket, whichever worker woke first took a burst of connections whole (of 64
    opened at once, two workers took up to 56/8, once 64/0), and kept them as long as they lasted. A socket
    without the option is bound first, and closed: it fails where anything listens on the port, a gateway
    started earlier included, which the option would otherwise let share the port unnoticed."""
    _bind(host, port).close()
    first = _bind(host, port, reuse_port=True)
    port = first.getsockname()[1]  # port 0 (any): the one the first got
    return [first, *(_bind(host, port, reuse_port=True) for _ in range(workers - 1))]


def _bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        raise StartupError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    listener.set_inheritable(True)  # the worker processes serve on it
    return listener


def listen(listeners: list[socket.socket]) -> None:
    """Accept connections from now on, before the server (or any worker) has started: until one accepts it, a
    connection waits in the backlog. Refused, it would make a load balancer take this instance out for a while
    (nginx's `fail_timeout`), and a rolling restart could then find every instance out at once."""
    for listener in listeners:
        listener.listen(BACKLOG)


def check_pinning(settings: Settings) -> None:
    """Refuse CREDGATE_PIN_WORKERS, before anything starts, where processes cannot be pinned to cores."""
    if settings.pin_workers and not hasattr(os, "sched_setaffinity"):
        raise StartupError("CREDGATE_PIN_WORKERS needs a system that pins processes to cores (Linux)")


def pin_worker(index: int) -> None:
    """Worker `index` (CREDGATE_PIN_WORKERS), every thread of it, on one core: the CPUs this process may use taken
    in turn (with more workers than CPUs, some share one). Its event loop and its database thread then share that
    core's caches and hand the GIL to each other there. A failure (the cpuset changed under it) leaves it serving,
    with a warning: a worker that failed to start would be replaced, and fail, for ever."""
    cores = sorted(os.sched_getaffinity(0))
    core = cores[index % len(cores)]
    for thread in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread), {core})
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
        except OSError as error:
            logger.warning("worker %d could not pin itself to core %d: %s", index, core, error.strerror or error)
            return


def run_workers(settings: Settings, build: GatewayFactory, listeners: Listeners, *, database_id: str) -> None:
    """Serve with `settings.workers` processes on `listeners` (from `bind_listeners`), once the caller has opened,
    checked and migrated database `database_id`. A worker that dies is replaced; SIGTERM or SIGINT drains every
    worker and returns. StartupError when a worker could not start (the supervisor then stops them all)."""
    config = WorkerConfig(settings, build, database_id)
    supervisor = _Supervisor(config, listeners)
    # The workers' metrics, summed by whichever worker answers /metrics: a folder of this run's own.
    metrics_dir = None
    if metrics.MULTIPROCESS_DIR not in os.environ:
        metrics_dir = os.environ[metrics.MULTIPROCESS_DIR] = tempfile.mkdtemp(prefix="credgate-metrics-")
    try:
        with _main_not_rerun_in_workers():
            supervisor.run()
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    if any(worker.exitcode == STARTUP_FAILURE for worker in supervisor.processes):
        raise StartupError("a worker process could not start: see its error above")


@contextmanager
def _main_not_rerun_in_workers() -> Iterator[None]:
    """multiprocessing's spawn runs the parent's main module again in every worker, as `__mp_main__`: here the
    `credgate` script, and with it the whole CLI (about 2 MB a worker), though a worker needs only the pickled
    gateway factory. A main module that names itself `*.__main__` is left alone (multiprocessing.spawn), so the
    script is named so while the workers are started."""
    main = sys.modules["__main__"]
    named = getattr(main, "__spec__", None)
    if named is None:
        main.__spec__ = importlib.machinery.ModuleSpec("credgate.__main__", None)
    try:
        yield
    finally:
        main.__spec__ = named


class WorkerApp:
    """One worker's gateway. At lifespan start it attaches to the database the parent set up (no migration, no
    first-run setup), builds the gateway on that context and hands it the lifespan; the context is closed once
    the gateway's own shutdown is done."""

    def __init__(self, settings: Settings, build: GatewayFactory, database_id: str) -> None:
        self.settings = settings
        self.build = build
        self.database_id = database_id
        self.gateway: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if self.gateway is None:
            raise RuntimeError("uvicorn serves requests only once the lifespan has started")
        await self.gateway(scope, receive, send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        startup = await receive()
        try:
            ctx: Context = await attach_context(self.settings, database_id=self.database_id)
        except StartupError as error:
            await send({"type": "lifespan.startup.failed", "message": str(error)})
            return
        self.gateway = self.build(self.settings, context=ctx)
        startup_replayed = False

        async def receive_from_startup() -> Message:
            nonlocal startup_replayed
            if startup_replayed:
                return await receive()
            startup_replayed = True
            return startup

        async def send_once_closed(message: Message) -> None:
            # Closed before uvicorn hears the shutdown is complete: it then ends the process, cancelling what is left.
            if message["type"] in {"lifespan.shutdown.complete", "lifespan.shutdown.failed"}:
                await ctx.close()
            await send(message)

        try:
            await self.gateway(scope, receive_from_startup, send_once_closed)
        except BaseException:
            await ctx.close()
            raise


class WorkerConfig(uvicorn.Config):
    """A worker's uvicorn configuration. The supervisor pickles it into every worker it spawns: what crosses is
    only what rebuilds it there, since neither the protocol class (made at run time) nor the app pickles."""

    def __init__(self, settings: Settings, build: GatewayFactory, database_id: str, index: int | None = None) -> None:
        self.settings = settings
        self.recipe = (settings, build, database_id, index)
        super().__init__(
            WorkerApp(settings, build, database_id),
            **_options(settings),
            lifespan="on",  # a worker whose start fails exits with STARTUP_FAILURE, so the supervisor stops
            workers=settings.workers,
            timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS,
        )

    def of_worker(self, index: int) -> "WorkerConfig":
        """The configuration of worker `index`, which pins itself to its core as it starts."""
        settings, build, database_id, _ = self.recipe
        return WorkerConfig(settings, build, database_id, index)

    def __reduce__(self) -> tuple[Callable[..., "WorkerConfig"], tuple[Settings, GatewayFactory, str, int | None]]:
        return _worker_process_config, self.recipe


def _worker_process_config(
    settings: Settings, build: GatewayFactory, database_id: str, index: int | None
) -> WorkerConfig:
    """Run when a new worker process unpickles its configuration, before it starts a thread: set the process up
    as `credgate serve` does."""
    configure_logging(settings)
    if index is not None:
        pin_worker(index)
    exit_zero_on_sigterm()
    return WorkerConfig(settings, build, database_id, index)


class _Supervisor(Multiprocess):
    """uvicorn's supervisor, with each worker on its own main listener (a replacement on its predecessor's, where
    the connections that came meanwhile wait), the listeners closed when the workers are told to stop, and its
    wait for them bounded by the drain (it waits for ever). The number of workers is the one it started with."""

    def __init__(self, config: WorkerConfig, listeners: Listeners) -> None:
        super().__init__(config, sockets=listeners.all())
        self.listeners = listeners
        pinned = config.settings.pin_workers
        self.configs = [config.of_worker(index) if pinned else config for index in range(config.workers)]

    def _started(self, index: int) -> Process:
        process = Process(self.configs[index], self.listeners.of_worker(index))
        process.start()
        return process

    def init_processes(self) -> None:
        self.processes = [self._started(index) for index in range(self.processes_num)]

    def terminate_all(self) -> None:
        for listener in self.sockets:
            # The parent's copy: once the workers have closed theirs too, a new connection is refused (as with
            # one process), not left waiting in the backlog of a socket nobody accepts from any more.
            listener.close()
        super().terminate_all()

    def keep_subprocess_alive(self) -> None:
        """uvicorn's, each replacement started on the listener of the worker it replaces."""
        if self.should_exit.is_set():
            return
        for index, worker in enumerate(self.processes):
            if worker.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            worker.kill()  # hung, or already gone
            worker.join()
            if worker.exitcode == STARTUP_FAILURE:  # the next would fail the same way: stop
                logger.error("worker %s could not start: stopping", worker.pid)
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            logger.info("worker %s died: replaced", worker.pid)
            if worker.pid is not None:
                metrics.forget_process(worker.pid)  # its gauges (requests in flight) no longer count
            self.processes[index] = self._started(index)

    def restart_all(self) -> None:
        """SIGHUP: uvicorn's, each replacement started on the listener of the worker it replaces, which drains once
        the replacement is ready."""
        for index, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new = self._started(index)
            if not new.wait_until_ready(self.config.timeout_worker_healthcheck, self.should_exit):
                new.kill()
                new.join()
                if not self.should_exit.is_set():
                    logger.error("worker %s was not ready in time: %s kept, the restart stopped", new.pid, old.pid)
                return
            old.terminate()
            old.join()
            if old.pid is not None:
                metrics.forget_process(old.pid)
            self.processes[index] = new

    def handle_ttin(self) -> None:
        logger.warning("SIGTTIN ignored: the number of workers is --workers (CREDGATE_WORKERS)")

    def handle_ttou(self) -> None:
        logger.warning("SIGTTOU ignored: the number of workers is --workers (CREDGATE_WORKERS)")

    def join_all(self) -> None:
        drain = self.config.timeout_graceful_shutdown or 0
        deadline = time.monotonic() + drain + WORKER_EXIT_MARGIN_SECONDS
        for worker in self.processes:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.exitcode is None:
                logger.warning("worker %s did not exit after the drain: killed", worker.pid)
                worker.kill()
                worker.process.join()
