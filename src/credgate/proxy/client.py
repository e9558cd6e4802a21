"""The client side of a proxied request: its body as the upstream reads it, a client that leaves, the gateway's own
error answers, and a place under the project's cap freed before the answer ends. Raw ASGI, no knowledge of the
upstream."""

import asyncio
from collections.abc import AsyncIterator, Callable

from starlette.types import Message, Receive, Send

from credgate.error_responses import ERROR_HEADER, error_body
from credgate.errors import ServiceError
from credgate.fleet.concurrency import Place, Places
from credgate.proxy.deadlines import Deadlines

WATCH_DELAY_SECONDS = 0.05
# RFC 6750: a 401 names the scheme the client should use.
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="credgate"'}
_JSON_ERROR_HEADERS = [(b"content-type", b"application/json"), (ERROR_HEADER.encode(), b"true")]


class BodyProblem(Exception):
    """The client's body could not be relayed."""


class BodyTooLarge(BodyProblem):
    pass


class ClientGone(BodyProblem):
    pass


class ClientIdle(BodyProblem):
    pass


class ClientWatch:
    """Notices a client that leaves once its request is read, and cancels the relay, so the upstream
    connection is freed whether the upstream is still thinking or streaming (uvicorn's `send` would just
    drop the bytes and let the relay run on).

    The watching task starts only if the relay is still running `WATCH_DELAY_SECONDS` after the body, to the next
    tick of the deadlines: a quick exchange costs a set entry, not a task nor a timer of its own (the loop timer and
    its cancellation were about 1% of a request's instructions), and a slow one (a generation) notices a departed
    client within the delay and a tick, 0.15 s. Not later: each departed client's upstream response goes on until
    then, billed, its buffers held; the delay is still far longer than a quick exchange."""

    def __init__(self, receive: Receive, deadlines: Deadlines) -> None:
        self._receive = receive
        self._deadlines = deadlines
        self._started = False
        self.deadline = 0.0  # when the watching task is due, once the body is read
        self._task: asyncio.Task[None] | None = None
        self._relay = asyncio.current_task()  # the relay, even when start() runs in the upstream client's body writer
        self.client_gone = False
        # uvicorn reports a disconnect once the response is complete, too: that one is not a client leaving.
        self.finishing = False

    def start(self) -> None:
        if self._relay is not None and not self._started:
            self._started = True
            loop = asyncio.get_running_loop()
            self.deadline = loop.time() + WATCH_DELAY_SECONDS
            self._deadlines.add(self, loop)

    def expire(self) -> None:
        if self._relay is not None and not self._relay.done():
            self._task = asyncio.create_task(self._watch(self._relay))

    async def _watch(self, relay: asyncio.Task[object]) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        if not self.finishing:
            self.client_gone = True
            relay.cancel()

    def stop(self) -> None:
        self._deadlines.discard(self)
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def absorb_cancellation(self) -> bool:
        """True (and the cancellation undone) when it was this watch that cancelled the relay."""
        task = asyncio.current_task()
        if self.client_gone and task is not None:
            task.uncancel()
            return True
        return False


class RequestBody:
    """The client's body as the upstream reads it: whole when it came in one piece, else streamed,
    counted against the limit and the client's idle time either way."""

    def __init__(
        self,
        receive: Receive,
        *,
        limit: int,
        idle_seconds: float,
        on_complete: Callable[[], None],
        deadlines: Deadlines,
    ) -> None:
        self._receive = receive
        self._deadlines = deadlines
        self._on_complete = on_complete
        self._limit = limit
        self._idle = idle_seconds
        self.received = 0
        self.problem: BodyProblem | None = None

    async def _next(self) -> tuple[bytes, bool]:
        try:
            with self._deadlines.within(self._idle):
                message = await self._receive()
        except TimeoutError:
            self.problem = ClientIdle()
            raise self.problem from None
        if message["type"] == "http.disconnect":
            self.problem = ClientGone()
            raise self.problem
        chunk: bytes = message.get("body", b"")
        self.received += len(chunk)
        if self.received > self._limit:
            self.problem = BodyTooLarge()
            raise self.problem
        more = bool(message.get("more_body", False))
        if not more:
            self._on_complete()
        return chunk, more

    async def first(self) -> bytes | AsyncIterator[bytes] | None:
        chunk, more = await self._next()
        if not more:
            return chunk or None
        return self._rest(chunk)

    async def whole(self, first: bytes | AsyncIterator[bytes] | None) -> bytes:
        """The whole body, from what `first()` returned."""
        if first is None or isinstance(first, bytes):
            return first or b""
        return b"".join([chunk async for chunk in first])

    async def _rest(self, first: bytes) -> AsyncIterator[bytes]:
        yield first
        more = True
        while more:
            chunk, more = await self._next()
            if chunk:
                yield chunk


async def send_error(send: Send, error: ServiceError) -> int:
    """Answer the service error; returns the body's size."""
    body = error_body(error.status, error.message)
    headers = [
        *_JSON_ERROR_HEADERS,
        (b"content-length", str(len(body)).encode()),
        *((name.lower().encode(), value.encode()) for name, value in error.headers.items()),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return len(body)


class FreeingSend:
    """The send of a request that holds a place under its project's cap: the place is freed, for every process,
    before the response's last message goes. A client that sends its next request the moment it has an answer
    (an SDK with as many connections as the cap, say) then finds the place free on whichever instance it reaches."""

    __slots__ = ("_place", "_places", "_send")

    def __init__(self, send: Send, places: Places, place: Place) -> None:
        self._send, self._places = send, places
        self._place: Place | None = place

    async def __call__(self, message: Message) -> None:
        if self._place is not None and message["type"] == "http.response.body" and not message.get("more_body"):
            place, self._place = self._place, None
            await self._places.free(place)
        await self._send(message)

    def give_back(self) -> None:
        """The place of a response that did not end (cut off, its client gone), if it is still held."""
        if self._place is not None:
            place, self._place = self._place, None
            self._places.give_back(place)
