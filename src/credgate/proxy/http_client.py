"""The proxy's upstream client: HTTP/1.1 over keep-alive connections pooled by scheme, host and port. A request
leaves in one write; its response is parsed by httptools (llhttp, the parser uvicorn serves with) and handed to the
relay as its bytes arrive.

aiohttp's client carried proxied requests before. Its request machinery (a request, a response, a payload and a
writer task per call, headers merged through multidicts) made most of a bare proxy's cost: the benchmark's bare
proxy took 129 µs of CPU a request at 64 connections and added 0.33 ms at one; the same proxy over a client like
this one, 92 µs and 0.17 ms. It carries every other outbound call too (key verifications, OAuth token fetches,
identity providers' keys, webhooks), so a worker loads no other HTTP client: aiohttp's weighed 10 MB in each.

It does what a gateway's relay needs and no more: no redirect, cookie, decompression or proxy; no header of its
own but Host and the body's framing; and no retry: an upstream may have acted on a request whose connection
dropped. Names resolve through the address guard's resolver (`PublicOnlyResolver` or an integration's
exceptions'), each answer kept 10 s; a literal address is judged by its spelling before the call (Upstreams).
"""

import asyncio
import contextlib
import ipaddress
import socket
import ssl
import time
from collections.abc import AsyncIterator
from urllib.parse import unquote

import aiohappyeyeballs
import httptools
from yarl import URL

from credgate.proxy.guard import Address, NonPublicAddress, Resolver

MAX_HEAD_BYTES = 65536  # an upstream's status line and headers; the connection is dropped past it
MAX_HEADERS = 128
KEEP_ALIVE_SECONDS = 15.0  # an idle connection is closed after this (aiohttp's default too)
CONNECT_TIMEOUT_SECONDS = 30.0
HAPPY_EYEBALLS_DELAY_SECONDS = 0.25  # RFC 8305's recommended delay before the next address is tried
DNS_TTL_SECONDS = 10.0
# A response's bytes buffered before the relay takes them: past this, reading from the upstream pauses until the
# relay takes them (a client that reads slowly makes the upstream wait; memory stays bounded).
PAUSE_READING_BYTES = 262144
_BODILESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})  # no Content-Length: 0 without a body
_LAST_CHUNK = b"0\r\n\r\n"
Header = tuple[str, str]


class UpstreamError(ConnectionError):
    """The upstream could not be reached, or broke its response off."""


class UpstreamClosed(UpstreamError):
    """The upstream closed the connection before its response was complete."""


class UpstreamFraming(UpstreamError):
    """The upstream's bytes are not HTTP/1.1 (or its head is over the bounds): the connection is dropped."""


class UpstreamResponse:
    """A response as it arrives: status and headers first, then the body, buffered until the relay takes it."""

    __slots__ = ("_buffered", "_chunks", "_connection", "_eof", "_error", "_named", "_waiter", "raw_headers", "status")

    def __init__(self, connection: "_Connection") -> None:
        self._connection: _Connection | None = connection
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._named: dict[bytes, bytes] = {}  # each header's first value by its name in lower case
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def header(self, name: str) -> str | None:
        """The first value of the header `name` (any case), or None."""
        value = self._named.get(name.lower().encode())
        return None if value is None else value.decode("latin-1")

    def is_eof(self) -> bool:
        """Whether the body has arrived whole (some of it may still be buffered)."""
        return self._eof

    def at_eof(self) -> bool:
        """Whether the body has arrived whole and been read."""
        return self._eof and not self._chunks

    def read_nowait(self) -> bytes:
        """What has arrived and not been read yet (b"" if nothing); raises if the upstream broke the body."""
        if self._error is not None:
            raise self._error
        if not self._chunks:
            return b""
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks, self._buffered = [], 0
        connection = self._connection
        if connection is not None and connection.reading_paused:
            connection.resume_reading()
        return data

    async def read_any(self) -> bytes:
        """The next bytes of the body, as soon as some arrive; b"" at its end."""
        while not self._chunks and not self._eof and self._error is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.read_nowait()

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body (for a response whose body is small and bounded, such as a provider's error); over
        `limit` bytes, ValueError."""
        parts, size = [], 0
        while chunk := await self.read_any():
            size += len(chunk)
            if limit is not None and size > limit:
                raise ValueError(f"the upstream's response body is over {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Done with the response: its connection goes back to the pool if the response was read to its end,
        else it is closed (its unread rest would be taken for the next response)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.done_with(self, complete=self._eof and self._error is None)

    # fed by the connection

    def _feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        self._wake()

    def _finish(self) -> None:
        self._eof = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if not self._eof and self._error is None:
            self._error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its response parsed as it arrives."""

    def __init__(self, pool: "Connections", key: tuple[str, str, int]) -> None:
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reading_paused = False
        self.idle_since = 0.0
        self.response: UpstreamResponse | None = None
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._head_only = False  # a HEAD request's response: no body follows, whatever its headers say
        self._until_close = False  # a body framed by the connection's end
        self._interim = False  # a 1xx response, followed by the actual one
        self._complete = False  # the response to the request out has been received whole
        self._head_bytes = 0  # received while the head is incomplete (the parser holds them); -1 once it is complete
        self._header_bytes = 0  # of the head's headers
        self._reusable = False
        self._writable: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:  # closed here (abort), which settled the request
            return
        if self._until_close and exc is None and self.response is not None and self._head_bytes < 0:
            self.response._finish()
        self._close(UpstreamClosed("the upstream closed the connection before its response's end"))

    def data_received(self, data: bytes) -> None:
        if self._head_bytes >= 0:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken(UpstreamFraming("the upstream switched protocols"))
        except Exception as error:  # llhttp's verdict, or a bound checked in a callback
            self._broken(error if isinstance(error, UpstreamError) else UpstreamFraming("the upstream broke HTTP"))
        else:
            # A head still incomplete (its parts wait in the parser) over the bound: no head is that long.
            if self._head_bytes > MAX_HEAD_BYTES:
                self._broken(UpstreamFraming(f"the upstream's response head is over {MAX_HEAD_BYTES} bytes"))

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # httptools' callbacks

    def on_message_begin(self) -> None:
        if self.response is None or self._complete:
            # Bytes past the response, or with no request out: HTTP/1.1 has no place for them, and taking them for
            # the next response would answer that request with what the upstream chose before it was asked.
            raise UpstreamFraming("the upstream sent a response nobody asked for")
        self._head_bytes = max(self._head_bytes, 0)
        self._header_bytes = 0
        self.response.raw_headers, self.response._named = [], {}

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is None:
            raise UpstreamFraming("the upstream answered no request")
        headers = self.response.raw_headers
        self._header_bytes += len(name) + len(value)
        if len(headers) >= MAX_HEADERS or self._header_bytes > MAX_HEAD_BYTES:
            raise UpstreamFraming(
                f"the upstream's response head is over {MAX_HEADERS} headers or {MAX_HEAD_BYTES} bytes"
            )
        headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None  # on_header checked  # noqa: S101
        self._head_bytes = -1
        status = self.parser.get_status_code()
        if status < 200:
            self._interim = True  # 100 Continue, 103 Early Hints: the actual response follows
            return
        response.status = status
        named = response._named
        for name, value in reversed(response.raw_headers):  # reversed: the first value stays
            named[name.lower()] = value
        self._until_close = (
            status not in (204, 304) and b"content-length" not in named and b"transfer-encoding" not in named
        )
        if self._head is not None and not self._head.done():
            self._head.set_result(response)
        if self._head_only:
            self._reusable = False  # llhttp would read the body the headers announce: none comes
            response._finish()

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is None or self._head_only:
            return
        response._feed(body)
        if response._buffered >= PAUSE_READING_BYTES and not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._complete = True
        response = self.response
        if response is not None and not self._head_only:
            self._reusable = self.parser.should_keep_alive() and (self._writer is None or self._writer.done())
            response._finish()

    # used by the pool and the response

    def resume_reading(self) -> None:
        self.reading_paused = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    async def send(
        self, head: bytes, body: bytes | AsyncIterator[bytes] | None, *, head_only: bool, chunked: bool
    ) -> UpstreamResponse:
        """Write the request, then wait for the response's head. Whatever ends the wait early (a timeout, the
        client leaving) closes the connection: it may still carry that request's answer."""
        assert self.transport is not None  # noqa: S101 - pooled connections are connected
        loop = asyncio.get_running_loop()
        self.response = UpstreamResponse(self)
        self._head = loop.create_future()
        self._head_only, self._until_close, self._interim, self._reusable = head_only, False, False, False
        self._complete = False
        self._head_bytes = 0
        try:
            if body is None or isinstance(body, bytes):
                self.transport.write(head + body if body else head)
            else:
                self.transport.write(head)
                self._writer = loop.create_task(self._write_body(body, chunked))
            return await self._head
        except BaseException:
            self.abort()
            raise
        finally:
            self._head = None

    async def _write_body(self, chunks: AsyncIterator[bytes], chunked: bool) -> None:
        """A body streamed from the client, as its pieces come: an error of the client's (it left, it sent too
        much) or of the upstream's ends the request, and is what the wait for the response's head raises."""
        transport = self.transport
        assert transport is not None  # noqa: S101
        try:
            async for chunk in chunks:
                if not chunk:
                    continue
                if chunked:
                    transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                else:
                    transport.write(chunk)
                if self._writable is not None:
                    await self._writable
            if chunked:
                transport.write(_LAST_CHUNK)
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            self._broken(error)

    def done_with(self, response: UpstreamResponse, *, complete: bool) -> None:
        if response is not self.response:
            return
        self.response = None
        writer, self._writer = self._writer, None
        if writer is not None and not writer.done():
            writer.cancel()
            complete = False
        if complete and self._reusable and not self.closed:
            self.pool.put_back(self)
        else:
            self.abort()

    def _broken(self, error: BaseException) -> None:
        self._close(error)
        if self.transport is not None:
            self.transport.abort()

    def abort(self) -> None:
        """Close the connection at once: a request under way on it fails, a response being read is cut."""
        if not self.closed:
            self._broken(UpstreamClosed("the connection to the upstream was closed"))

    def _close(self, error: BaseException) -> None:
        """The connection is over: whoever waits on it gets `error` (unless its response is complete)."""
        if self.closed:
            return
        self.closed = True
        self.pool.forget(self)
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(error)
        head = self._head
        if head is not None and not head.done():
            head.set_exception(error)
        elif self.response is not None:
            self.response._fail(error)


class Connections:
    """Keep-alive connections to upstreams, pooled by scheme, host and port, opened through one resolver (whose
    guard admits what the pool may dial: SystemResolver any address, with CREDGATE_ALLOW_PRIVATE_UPSTREAMS) and
    capped at `limit` open at once: a request beyond waits for a connection to be released (bounded by its
    timeout, as is all of its wait)."""

    def __init__(self, resolver: Resolver, *, tls: ssl.SSLContext, limit: int = 1000) -> None:
        self.resolver = resolver
        self._tls = tls
        self.limit = limit
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._waiters: list[asyncio.Future[None]] = []
        self._answers: dict[tuple[str, int], tuple[float, list[Address]]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self.closed = False

    @property
    def in_use(self) -> int:
        """Connections lent to a request (open, not idle in the pool)."""
        return len(self._open) - self._idle_count()

    async def request(
        self,
        method: str,
        url: URL,
        headers: list[Header],
        data: bytes | AsyncIterator[bytes] | None = None,
    ) -> UpstreamResponse:
        """Send the request; the response once its head has arrived (release() it when done)."""
        head, chunked = request_head(method, url, headers, data)
        key = (url.scheme, url.raw_host or "", url.port or 0)
        connection = self._idle_connection(key) or await self._connect(key)
        return await connection.send(head, data, head_only=method == "HEAD", chunked=chunked)

    async def fetch(
        self, method: str, url: URL, headers: list[Header], data: bytes | None = None, *, limit: int
    ) -> tuple[int, bytes]:
        """A small exchange (a token, a key set): the response's status and its whole body, over `limit` bytes a
        ValueError; the connection released either way."""
        response = await self.request(method, url, headers, data)
        try:
            return response.status, await response.read(limit=limit)
        finally:
            response.release()

    def put_back(self, connection: _Connection) -> None:
        if self.closed:
            connection.abort()
            return
        connection.idle_since = time.monotonic()
        self._idle.setdefault(connection.key, []).append(connection)
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(KEEP_ALIVE_SECONDS, self._close_stale)
        self._wake_waiter()

    def forget(self, connection: _Connection) -> None:
        """A connection closed: no longer open, nor idle."""
        if connection in self._open:
            self._open.discard(connection)
            idle = self._idle.get(connection.key)
            if idle is not None and connection in idle:
                idle.remove(connection)
            self._wake_waiter()

    def clear_dns_cache(self) -> None:
        """Forget every answer kept: the next connection to a name asks the resolver again."""
        self._answers.clear()

    async def close(self) -> None:
        """Close every connection, idle or lent (what is streaming is cut); new requests are refused."""
        self.closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for connection in list(self._open):
            connection.abort()
        self._idle.clear()
        await asyncio.sleep(0)  # the transports' connection_lost

    def retire(self) -> None:
        """No new request: the idle connections close now, the lent ones as they are released."""
        self.closed = True
        for idle in list(self._idle.values()):
            for connection in list(idle):
                connection.abort()
        self._idle.clear()

    def _idle_connection(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to have been closed meanwhile
            if not connection.closed and connection.transport is not None and not connection.transport.is_closing():
                return connection
            connection.abort()
        return None

    async def _connect(self, key: tuple[str, str, int]) -> _Connection:
        if self.closed:
            raise UpstreamError("the connection pool is closed")
        while self.in_use >= self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_waiter()  # woken, then cancelled: the turn passes to the next in line
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                raise
            reused = self._idle_connection(key)
            if reused is not None:
                return reused
        # Over the limit with idle connections to other upstreams: the oldest of them makes room.
        while len(self._open) >= self.limit and self._close_oldest_idle():
            pass
        connection = _Connection(self, key)
        self._open.add(connection)  # its place taken before any wait: requests connecting at once keep the limit
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                addresses = await self._addresses(key[1], key[2])
                if not addresses:
                    raise UpstreamError(f"{key[1]} has no address")
                await self._dial(connection, addresses)
        except TimeoutError:
            self.forget(connection)
            # This timeout, or the system's own connect timeout before it (ETIMEDOUT): the same failure.
            raise UpstreamError(f"no connection to {key[1]}: timed out") from None
        except BaseException:
            self.forget(connection)
            raise
        if connection.closed:  # closed as it opened (by the upstream, or the pool's close)
            if connection.transport is not None:
                connection.transport.abort()
            raise UpstreamClosed(f"the connection to {key[1]} closed as it opened")
        return connection

    async def _dial(self, connection: _Connection, addresses: list[Address]) -> None:
        """Dial the addresses as Happy Eyeballs does (RFC 8305): the next one tried 0.25 s after the last if it has
        not answered yet, the families taken in turn (the resolver's first first), so that a family the network
        silently drops costs a fraction of a second rather than the whole connect timeout."""
        scheme, host, port = connection.key
        try:
            sock = await aiohappyeyeballs.start_connection(
                [_address_info(address, family, port) for address, family in addresses],
                happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY_SECONDS,
                interleave=1,
            )
        except RuntimeError as error:  # uvloop's way to refuse an address: a connection error like any other
            raise UpstreamError(f"no connection to {host}") from error
        tls = scheme == "https"
        try:
            await asyncio.get_running_loop().create_connection(
                lambda: connection,
                sock=sock,
                ssl=self._tls if tls else None,
                server_hostname=host.rstrip(".") if tls else None,
            )
        except BaseException:
            sock.close()
            raise

    async def _addresses(self, host: str, port: int) -> list[Address]:
        """Where `host` may be reached: a literal address as it is, if the resolver's guard admits it (the proxy
        judged its spelling before: this is the second check); a name as the resolver answers it, the answer kept
        for DNS_TTL_SECONDS."""
        literal = unquote(host) if ":" in host else host  # an IPv6 literal's scope: its % is spelt %25 in a URL
        try:
            address = ipaddress.ip_address(literal)
        except ValueError:
            pass
        else:
            if not self.resolver.admits(literal):
                raise NonPublicAddress(f"{literal} is not an address this pool may reach")
            return [(literal, socket.AF_INET6 if address.version == 6 else socket.AF_INET)]
        now = time.monotonic()
        known = self._answers.get((host, port))
        if known is not None and known[0] > now:
            return known[1]
        answers = await self.resolver.resolve(host, port)
        if len(self._answers) >= 1000:
            self._answers.clear()
        self._answers[(host, port)] = (now + DNS_TTL_SECONDS, answers)
        return answers

    def _idle_count(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    def _close_oldest_idle(self) -> bool:
        oldest = min((c for idle in self._idle.values() for c in idle), key=lambda c: c.idle_since, default=None)
        if oldest is None:
            return False
        oldest.abort()
        return True

    def _wake_waiter(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    def _close_stale(self) -> None:
        self._sweep = None
        stale_before = time.monotonic() - KEEP_ALIVE_SECONDS
        for idle in list(self._idle.values()):
            for connection in [c for c in idle if c.idle_since <= stale_before]:
                connection.abort()
        if self._idle_count():
            self._sweep = asyncio.get_running_loop().call_later(KEEP_ALIVE_SECONDS, self._close_stale)


def _address_info(address: str, family: int, port: int) -> aiohappyeyeballs.AddrInfoType:
    """getaddrinfo's shape of an address to dial (an IPv6 one with its scope as a number)."""
    if family == socket.AF_INET6:
        host, _, scope = address.partition("%")
        scope_id = int(scope) if scope.isdigit() else socket.if_nametoindex(scope) if scope else 0
        # The scope in the host too: uvloop's connect reads only the host and the port of the address.
        host = f"{host}%{scope_id}" if scope_id else host
        return (family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port, 0, scope_id))
    return (family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))


def request_head(
    method: str, url: URL, headers: list[Header], data: bytes | AsyncIterator[bytes] | None
) -> tuple[bytes, bool]:
    """The request line and headers, with Host (unless given) and the body's framing; and whether the body goes
    chunked (streamed without a length). A header holding a line break is refused (ValueError): it would end the
    header early, and what followed would be a header, or a request, of the sender's choosing."""
    lines = [f"{method} {url.raw_path_qs or '/'} HTTP/1.1"]
    names = set()
    for name, value in headers:
        names.add(name.lower())
        lines.append(f"{name}: {value}")
    if "host" not in names:
        lines.insert(1, f"Host: {url.host_port_subcomponent}")
    chunked = False
    if isinstance(data, bytes):
        if "content-length" not in names:
            lines.append(f"Content-Length: {len(data)}")
    elif data is not None:
        if "content-length" not in names and "transfer-encoding" not in names:
            lines.append("Transfer-Encoding: chunked")
            chunked = True
    elif method not in _BODILESS_METHODS and "content-length" not in names:
        lines.append("Content-Length: 0")
    lines.append("\r\n")
    text = "\r\n".join(lines)
    # Each line ends in one CR LF: any other CR or LF came in a header (or the method, or the target).
    if text.count("\n") != len(lines) or text.count("\r") != len(lines):
        raise ValueError("a header holds a line break")
    try:
        return text.encode("latin-1"), chunked
    except UnicodeEncodeError:  # a value set in credgate beyond Latin-1 (a client's arrive as Latin-1)
        return text.encode(), chunked
