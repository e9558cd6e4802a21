"""The upstream side: which connections serve an integration's calls (proxied requests, key verifications, OAuth
token fetches): the public-only pool that every integration without exceptions shares, or one per distinct list of
exceptions (an integration's `private_networks`). The gateway's own calls (OAuth token fetches without exceptions,
identity providers' keys, webhooks) have a public-only pool apart, so that a proxy at its connection limit (a
thousand streams open, say) holds none of them up.

A pool keeps connections, and DNS answers, by host and port. Were two integrations to call the same host:port
through one pool, a connection opened under one's exception would serve the other, which has none. So each list
of exceptions gets a pool of its own, whose resolver admits exactly that list; integrations with the same list (in
any order) share it, since the same calls are allowed to them.
"""

import functools
import ssl
from collections import OrderedDict

from yarl import URL

from credgate.netguard import PrivateNetworks
from credgate.proxy.guard import PrivateNetworksResolver, PublicOnlyResolver, Resolver, SystemResolver
from credgate.proxy.http_client import Connections

# Distinct lists with a pool open at once; beyond that the least recently used one is retired.
MAX_EXCEPTION_POOLS = 64
OWN_CALLS_LIMIT = 100  # connections open at once for the gateway's own calls
_MAX_REMEMBERED_URLS = 10_000


@functools.cache
def tls_context() -> ssl.SSLContext:
    """Verified TLS, built without the environment: Python's default context would write every session secret
    (and with it the provider keys on the wire) to a file named by SSLKEYLOGFILE.

    One per process, shared by every pool: loading the system's CA certificates takes about 40 ms of the event
    loop, and a pool for an integration's private networks is opened on the request path."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # hostname checks and certificate verification on
    context.load_default_certs()
    return context


class Upstreams:
    """Which pool reaches an integration's upstream, and whether its URL is refused before connecting."""

    def __init__(
        self,
        *,
        allow_private: bool,
        max_pools: int = MAX_EXCEPTION_POOLS,
        ports: frozenset[int] | None = None,
        max_connections: int = 1000,
    ) -> None:
        """`ports`: those a public upstream may use (CREDGATE_UPSTREAM_PORTS); None: any. `max_connections`: open
        at once in each pool."""
        self._allow_private = allow_private
        self._ports = ports
        self._max_connections = max_connections
        self._max_pools = max_pools
        self.connections = Connections(self._public_resolver(), tls=tls_context(), limit=max_connections)
        self.own_calls = Connections(self._public_resolver(), tls=tls_context(), limit=OWN_CALLS_LIMIT)
        # A pool for each of the `max_pools` lists of exceptions used last, the oldest use first.
        self._pools: OrderedDict[PrivateNetworks, Connections] = OrderedDict()
        self._refused: dict[tuple[str, PrivateNetworks], bool] = {}
        self._refused_ports: dict[str, int | None] = {}

    @property
    def exception_pools(self) -> int:
        """How many pools of exceptions are open (retired ones, closing as their responses end, aside)."""
        return len(self._pools)

    def connections_for(self, exceptions: PrivateNetworks) -> Connections:
        """The pool for the proxied calls of an integration with these exceptions (see `_pool_for`)."""
        return self._pool_for(exceptions, shared=self.connections)

    def own_calls_for(self, exceptions: PrivateNetworks) -> Connections:
        """The pool for a call of the gateway's own on an integration's behalf (an OAuth token): the shared one of
        such calls when the integration has no exceptions, else its list's pool (which only that list's resolver
        may dial through)."""
        return self._pool_for(exceptions, shared=self.own_calls)

    def _pool_for(self, exceptions: PrivateNetworks, *, shared: Connections) -> Connections:
        """`shared`, public-only, when the integration has no exceptions (or CREDGATE_ALLOW_PRIVATE_UPSTREAMS leaves
        nothing to except); else the list's own pool. A pool that falls out of the most recent ones is retired: it
        closes its connections as their responses end."""
        if self._allow_private or not exceptions:
            return shared
        pool = self._pools.get(exceptions)
        if pool is not None:
            self._pools.move_to_end(exceptions)
            return pool
        pool = self._pools[exceptions] = Connections(
            PrivateNetworksResolver(exceptions), tls=tls_context(), limit=self._max_connections
        )
        while len(self._pools) > self._max_pools:
            self._pools.popitem(last=False)[1].retire()
        return pool

    def _public_resolver(self) -> Resolver:
        return SystemResolver() if self._allow_private else PublicOnlyResolver()

    def refuses(self, url: str, exceptions: PrivateNetworks) -> bool:
        """Whether a base or token URL is refused by its host's spelling alone, before any connection (no resolver
        is asked for a literal address); a name is judged by its answer, in `connections_for`'s resolver."""
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

    async def close(self) -> None:
        """Close every pool (what is streaming is cut)."""
        pools = [self.connections, self.own_calls, *self._pools.values()]
        self._pools.clear()
        for pool in pools:
            await pool.close()
