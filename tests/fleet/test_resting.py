"""A key a provider told to wait (429, 402) rests in every process that shares the fleet's Redis, not only in the
one that was told; another gateway on the same Redis hears nothing of it."""

import asyncio
import time
from dataclasses import dataclass, field

from credgate.crypto import Secret
from credgate.fleet import open_fleet
from credgate.proxy.key_pools import KeyPools
from credgate.resolved import PoolKey, ResolvedIntegration
from credgate.specs import BearerAuth
from tests.redis_server import shared_redis_url, unique_namespace

POOL = ResolvedIntegration(
    provider="pool",
    base_url="https://api.example.test",
    auth=BearerAuth(),
    endpoints=(),
    headers={},
    query={},
    enabled=True,
    timeout_seconds=10,
    stream_idle_timeout_seconds=10,
    total_timeout_seconds=60,
    credential=Secret("sk-first"),
    keys=(PoolKey("key_aaaa", Secret("sk-first")), PoolKey("key_bbbb", Secret("sk-second"))),
)


@dataclass
class Answer:
    """What passes_over reads of a provider's response."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


async def never_refused(project_id: str, provider: str, key_id: str, failure: str) -> None:
    raise AssertionError("no key is refused here")


async def test_a_key_told_to_wait_rests_in_every_process_of_the_fleet_and_in_no_other_gateway() -> None:
    namespace = unique_namespace()
    fleets = [open_fleet(shared_redis_url(), namespace=namespace) for _ in range(2)]
    other = open_fleet(shared_redis_url(), namespace=unique_namespace())
    told, elsewhere, stranger = (KeyPools(never_refused) for _ in range(3))
    told.announce = fleets[0].publish_rest
    followers = [
        asyncio.create_task(fleets[1].follow_resting(elsewhere.rested_elsewhere)),
        asyncio.create_task(other.follow_resting(stranger.rested_elsewhere)),
    ]
    try:
        await asyncio.sleep(0.3)  # subscribed
        first = POOL.keys[0]
        assert told.passes_over("p", POOL, first, Answer(429, {"Retry-After": "120"}), last=False)  # type: ignore[arg-type]
        sent = time.perf_counter()
        while [key.id for key in elsewhere.attempts("p", POOL)] != ["key_bbbb"]:
            assert time.perf_counter() - sent < 1, "the other process never heard that the key rests"
            await asyncio.sleep(0.005)
        assert [key.id for key in told.attempts("p", POOL)] == ["key_bbbb"]
        assert [key.id for key in stranger.attempts("p", POOL)] == ["key_aaaa", "key_bbbb"]
        # A notice for a rest that has already ended, or that is not ours, changes nothing.
        elsewhere.rested_elsewhere("key_bbbb", time.time() - 1)
        for garbage in ("x" * 1000 + " 1e18", "key_bbbb", "key_bbbb soon", "key_SECOND 9e9"):
            await fleets[0].redis.publish(fleets[0].resting_channel, garbage)
        await fleets[0].publish_rest("key_bbbb", time.time() - 5)  # ours, but over: the follower must live on
        await fleets[0].publish_rest("key_aaaa", time.time() + 60)
        await asyncio.sleep(0.3)
        assert [key.id for key in elsewhere.attempts("p", POOL)] == ["key_bbbb"]
    finally:
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
        for fleet in (*fleets, other):
            await fleet.close()
