"""The connection to Redis and the change notices that go through it."""

import asyncio
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from credgate import metrics
from credgate.errors import StartupError
from credgate.outages import Outage

if TYPE_CHECKING:
    from redis.asyncio import Redis

logger = logging.getLogger(__name__)

# Redis is asked on the request path (a rate limit): when it does not answer within this, the request goes on
# without it (counted in this process) rather than waiting longer. Generous enough for a saturated machine.
ANSWER_TIMEOUT_SECONDS = 1.0
# Connections to Redis per process: requests beyond it wait for one (within the answer timeout) rather than open
# more, which under a burst would cost more than the commands themselves.
MAX_CONNECTIONS = 32
# After a failure, Redis is tried again at most this often: requests meanwhile use the fallback at once.
RETRY_SECONDS = 1.0
_KEY_ID = re.compile(r"key_[0-9a-f]{1,40}")
# How long the change follower waits for a notice before it pings Redis to check that its subscription is alive.
_LISTEN_SECONDS = 1.0


class ScriptKeys(dict[str, int]):
    """The KEYS of one script call, each once, in the order first named. A call's packed argument writes `of(key)`,
    a key's index there (from 1, as Lua counts), instead of the key: redis-py writes each argument in Python, and a
    turn's requests mostly name the same few keys."""

    def of(self, key: str) -> int:
        return self.setdefault(key, len(self) + 1)


class Fleet:
    """One process's connection to the Redis its gateway's instances share, under a namespace of their own (the
    database's id), so that several gateways may share one Redis."""

    def __init__(self, redis: "Redis", *, namespace: str) -> None:
        self.redis = redis
        self.namespace = namespace
        self.changes_channel = f"{namespace}:changes"
        self.resting_channel = f"{namespace}:resting"  # keys a provider told to wait (429, 402), for every process
        self._announcing = Outage(
            logger,
            down="could not announce a resting key through Redis (%s): other processes learn of it alone",
            back="Redis answers again: resting keys are announced again",
            retry_seconds=RETRY_SECONDS,
        )
        self._publishing = Outage(
            logger,
            down="could not publish a change through Redis (%s): other instances find it by polling",
            back="Redis answers again: changes are published again",
            retry_seconds=RETRY_SECONDS,
        )

    def key(self, *parts: str) -> str:
        """A Redis key of this gateway's: `<namespace>:<part>:…`."""
        return ":".join((self.namespace, *parts))

    async def publish_change(self, marker: str) -> None:
        """Tell every instance that configuration changed. Never raises, and waits at most ANSWER_TIMEOUT_SECONDS
        (not at all for a second after a failure): instances still find the change by polling the database."""
        await self._publish(self.changes_channel, marker, self._publishing)

    async def _publish(self, channel: str, message: str, outage: Outage) -> None:
        if not outage.may_try():
            return
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_SECONDS):
                await self.redis.publish(channel, message)
        except Exception as error:
            outage.failed(error)
        else:
            outage.answered()

    async def follow_changes(self, on_change: Callable[[str | None], None]) -> None:
        """Call `on_change` with the change marker of every change notice, until cancelled; with None once at every
        (re)subscription, once Redis has confirmed it: notices sent while this process was not listening are lost.
        A subscription that hears nothing for _LISTEN_SECONDS pings Redis, so that a connection that died silently
        is replaced. A lost connection is retried every RETRY_SECONDS."""
        outage = Outage(
            logger,
            down="lost the change notices from Redis (%s): changes are found by polling until it answers",
            back="Redis answers again: change notices resumed",
            retry_seconds=RETRY_SECONDS,
            report=metrics.dependency_up.labels("redis").set,  # its subscription pings Redis every second
        )
        await self._follow(self.changes_channel, on_change, outage, subscribed=lambda: on_change(None))

    async def publish_rest(self, key_id: str, until: float) -> None:
        """Tell every process that a provider has a key wait until `until` (a Unix time). Never raises."""
        await self._publish(self.resting_channel, f"{key_id} {until:.3f}", self._announcing)

    async def follow_resting(self, on_rest: Callable[[str, float], None]) -> None:
        """Call `on_rest(key id, until as a Unix time)` for every key another process was told to rest, until
        cancelled. A notice lost while not listening costs that process one request to the key, as without Redis."""
        outage = Outage(
            logger,
            down="lost the resting keys' notices from Redis (%s): each process learns of them alone until it answers",
            back="Redis answers again: resting keys are shared again",
            retry_seconds=RETRY_SECONDS,
        )

        def heard(message: str | None) -> None:
            key_id, _, until = (message or "").partition(" ")
            if not _KEY_ID.fullmatch(key_id):
                return  # not a notice of ours: a key id is `key_` and hex digits
            try:
                when = float(until)
            except ValueError:
                return
            on_rest(key_id, when)

        await self._follow(self.resting_channel, heard, outage)

    async def _follow(
        self,
        channel: str,
        on_message: Callable[[str | None], None],
        outage: Outage,
        *,
        subscribed: Callable[[], None] | None = None,
    ) -> None:
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(channel)
                    while (confirmed := await pubsub.get_message(timeout=_LISTEN_SECONDS)) is None:
                        pass
                    if confirmed["type"] != "subscribe":
                        raise ConnectionError("the subscription was not confirmed")
                    if subscribed is not None:
                        subscribed()
                    outage.answered()
                    pinged = False
                    while True:
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=_LISTEN_SECONDS)
                        if message is None:
                            if pinged:
                                raise ConnectionError("Redis did not answer a ping")
                            await pubsub.ping()
                            pinged = True
                        elif message["type"] == "pong":
                            pinged = False
                        elif message["type"] == "message":
                            on_message(message["data"].decode("ascii", "replace"))
            except Exception as error:
                outage.failed(error)
                await asyncio.sleep(RETRY_SECONDS)

    async def close(self) -> None:
        """Close every connection to Redis."""
        await self.redis.aclose()
        await self.redis.connection_pool.disconnect()  # a pool given to the client is not closed with it


def open_fleet(url: str, *, namespace: str) -> Fleet:
    """A Fleet on the Redis at `url` (connections are made when first used: a start does not wait for Redis)."""
    try:
        from redis.asyncio import BlockingConnectionPool, Redis
    except ImportError:
        raise StartupError(
            "CREDGATE_REDIS_URL is set, but the Redis client is not installed: pip install 'credgate[redis]'"
        ) from None
    try:
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=ANSWER_TIMEOUT_SECONDS,
            socket_timeout=ANSWER_TIMEOUT_SECONDS,
            socket_connect_timeout=ANSWER_TIMEOUT_SECONDS,
        )
    except ValueError:
        # Its message may quote the URL, password included.
        raise StartupError("CREDGATE_REDIS_URL is not a valid redis:// URL") from None
    return Fleet(Redis(connection_pool=pool), namespace=namespace)
