"""The upstream side: which connections serve an integration's calls. Proxied requests and key verifications go
through the proxy's own client (http_client.Connections); OAuth token fetches, identity keys and webhooks through
an aiohttp session. Either is the public-only one that every integration without exceptions shares, or one per
distinct list of exceptions (an integration's `private_networks`).

Both pool connections, and cache DNS answers, by host and port. Were two integrations to call the same host:port
through one pool, a connection opened under one's exception would serve the other, which has none. So each list
of exceptions gets a pool of its own, whose resolver admits exactly that list; integrations with the same list (in
any order) share it, since the same calls are allowed to them.
"""

import asyncio
import contextlib
import functools
import ssl
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.client_proto import ResponseHandler
from aiohttp.helpers import _EXC_SENTINEL
from yarl import URL

from credgate.netguard import PrivateNetworks
from credgate.proxy.guard import PrivateNetworksResolver, PublicOnlyResolver
from credgate.proxy.http_client import Connections

# Distinct lists with a session open at once; beyond that the least recently used one is closed once idle.
MAX_EXCEPTION_SESSIONS = 64
_IDLE_CHECK_SECONDS = 1.0
_MAX_REMEMBERED_URLS = 10_000
SessionFactory = Callable[[AbstractResolver], aiohttp.ClientSession]
_Opened = TypeVar("_Opened")


class _MostRecent(Generic[_Opened]):
    """What is open for each list of exceptions, for the `size` lists used last: a new one pushes the least recently
    used out, to `retire`. One that `usable` rejects is opened again."""

    def __init__(
        self,
        size: int,
        open_for: Callable[[PrivateNetworks], _Opened],
        retire: Callable[[_Opened], None],
        usable: Callable[[_Opened], bool] = lambda _opened: True,
    ) -> None:
        self._size, self._open_for, self._retire, self._usable = size, open_for, retire, usable
        self._opened: OrderedDict[PrivateNetworks, _Opened] = OrderedDict()  # oldest use first

    def __len__(self) -> int:
        return len(self._opened)

    def get(self, exceptions: PrivateNetworks) -> _Opened:
        opened = self._opened.get(exceptions)
        if opened is not None and self._usable(opened):
            self._opened.move_to_end(exceptions)
            return opened
        opened = self._opened[exceptions] = self._open_for(exceptions)
        while len(self._opened) > self._size:
            self._retire(self._opened.popitem(last=False)[1])
        return opened

    def take_all(self) -> list[_Opened]:
        """Everything open, forgotten here (to be closed by the caller)."""
        opened = list(self._opened.values())
        self._opened.clear()
        return opened


class _FramingAwareResponseHandler(ResponseHandler):
    """aiohttp hands a parser error (broken chunk framing after good bytes, say) to the connection only, and a
    reader of the body then waits forever: hand it to the body too, so the relay cuts the response at once."""

    def set_exception(self, exc: BaseException, exc_cause: BaseException = _EXC_SENTINEL) -> None:
        payload = self._payload
        if payload is not None and not payload.is_eof():
            payload.set_exception(aiohttp.ClientPayloadError("the upstream broke the response's framing"), exc)
        super().set_exception(exc, exc_cause)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """Verified TLS, built without the environment: Python's default context would write every session secret
    (and with it the provider keys on the wire) to a file named by SSLKEYLOGFILE.

    One per process, shared by every session: loading the system's CA certificates takes about 40 ms of the event
    loop, and a session for an integration's private networks is opened on the request path."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # hostname checks and certificate verification on
    context.load_default_certs()
    return context


def create_http_session(
    *, allow_private_upstreams: bool, max_connections: int = 1000, resolver: AbstractResolver | None = None
) -> aiohttp.ClientSession:
    """The outbound client: raw bytes both ways, no redirects, no headers of its own, and (unless private
    upstreams are allowed) public addresses only, or what `resolver` admits (an integration's exceptions)."""
    connector = aiohttp.TCPConnector(
        limit=max_connections,
        limit_per_host=0,
        ttl_dns_cache=10,
        enable_cleanup_closed=True,
        resolver=None if allow_private_upstreams else resolver or PublicOnlyResolver(),
        ssl=tls_context(),
    )
    connector._factory = functools.partial(_FramingAwareResponseHandler, loop=asyncio.get_running_loop())  # type: ignore[assignment]
    session = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
    )
    # aiohttp resends an idempotent request when a reused connection drops before the answer; a gateway must
    # not (the upstream may have acted on it). No public switch exists; its own test utilities set this one.
    session._retry_connection = False
    return session


class Upstreams:
    """Which session reaches an integration's upstream, and whether its URL is refused before connecting."""

    def __init__(
        self,
        default: aiohttp.ClientSession,
        *,
        allow_private: bool,
        open_session: SessionFactory,
        max_sessions: int = MAX_EXCEPTION_SESSIONS,
        ports: frozenset[int] | None = None,
        max_connections: int = 1000,
    ) -> None:
        """`ports`: those a public upstream may use (CREDGATE_UPSTREAM_PORTS); None: any. `max_connections`: open
        at once by the proxy's client, in each of its pools."""
        self.default = default
        self._allow_private = allow_private
        self._ports = ports
        self._max_connections = max_connections
        self.connections = Connections(
            None if allow_private else PublicOnlyResolver(), tls=tls_context(), limit=max_connections
        )
        self._pools = _MostRecent(max_sessions, self._open_pool, Connections.retire)
        self._sessions = _MostRecent(
            max_sessions,
            lambda exceptions: open_session(PrivateNetworksResolver(exceptions)),
            self._retire,
            usable=lambda session: not session.closed,
        )
        self._retired: set[aiohttp.ClientSession] = set()
        self._closers: set[asyncio.Task[None]] = set()
        self._refused: dict[tuple[str, PrivateNetworks], bool] = {}
        self._refused_ports: dict[str, int | None] = {}

    @property
    def exception_sessions(self) -> int:
        """How many sessions of exceptions are open (serving or being retired)."""
        return len(self._sessions) + len(self._retired)

    def session_for(self, exceptions: PrivateNetworks) -> aiohttp.ClientSession:
        """The session for an integration with these exceptions: the shared public-only one when it has none
        (or when CREDGATE_ALLOW_PRIVATE_UPSTREAMS leaves nothing to except), else the list's own."""
        if self._allow_private or not exceptions:
            return self.default
        return self._sessions.get(exceptions)

    def connections_for(self, exceptions: PrivateNetworks) -> Connections:
        """The proxy client's pool for an integration with these exceptions, as `session_for` chooses sessions. A
        pool that falls out of the most recent ones is retired: it closes its connections as their responses end."""
        if self._allow_private or not exceptions:
            return self.connections
        return self._pools.get(exceptions)

    def _open_pool(self, exceptions: PrivateNetworks) -> Connections:
        return Connections(PrivateNetworksResolver(exceptions), tls=tls_context(), limit=self._max_connections)

    def refuses(self, url: str, exceptions: PrivateNetworks) -> bool:
        """Whether a base or token URL is refused by its host's spelling alone, before any connection (aiohttp
        asks no resolver for a literal address); a name is judged by its answer, in `session_for`'s resolver."""
        if self._allow_private:
            return False
        key = (url, exceptions)
        refused = self._refused.get(key)
        if refused is None:
            if len(self._refused) >= _MAX_REMEMBERED_URLS:
                self._refused.clear()
            refused = self._refused[key] = exceptions.refuses_host(URL(url).host or "")
        return refused

    def refused_port(self, url: str, exceptions: PrivateNetworks) -> int | None:
        """The port of a base or token URL when it is not one a public upstream may use: the list may have lost it
        since the integration was saved (SS-06). An integration with exceptions keeps the check of its save, where
        a listed host may use any port."""
        if self._allow_private or self._ports is None or exceptions:
            return None
        if url not in self._refused_ports:
            if len(self._refused_ports) >= _MAX_REMEMBERED_URLS:
                self._refused_ports.clear()
            port = URL(url).port
            self._refused_ports[url] = port if port not in self._ports else None
        return self._refused_ports[url]

    def _retire(self, session: aiohttp.ClientSession) -> None:
        # Closing a session cuts the responses it is streaming: it waits until none is in flight.
        self._retired.add(session)
        closer = asyncio.create_task(self._close_when_idle(session))
        self._closers.add(closer)
        closer.add_done_callback(self._closers.discard)

    async def _close_when_idle(self, session: aiohttp.ClientSession) -> None:
        while _in_use(session):  # noqa: ASYNC110  (aiohttp signals no release: polled, rarely)
            await asyncio.sleep(_IDLE_CHECK_SECONDS)
        self._retired.discard(session)
        await session.close()

    async def close(self) -> None:
        """Close every pool of the proxy's client, and every session of exceptions (the default session belongs to
        whoever made it)."""
        pools = [self.connections, *self._pools.take_all()]
        for pool in pools:
            await pool.close()
        for closer in list(self._closers):
            closer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closer
        sessions = [*self._sessions.take_all(), *self._retired]
        self._retired.clear()
        for session in sessions:
            await session.close()


def _in_use(session: aiohttp.ClientSession) -> bool:
    # aiohttp counts the connections lent out in its connector's `_acquired` and has no public way to ask.
    connector = session.connector
    return connector is not None and not connector.closed and bool(getattr(connector, "_acquired", ()))
