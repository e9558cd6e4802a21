"""Change notices through a real Redis: every process hears a change at once, and none fails for Redis."""

import asyncio
import contextlib
import logging
import statistics
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from credgate.errors import StartupError
from credgate.fleet import Fleet, open_fleet
from credgate.fleet.fleet import RETRY_SECONDS
from tests.redis_server import PrivateRedis, private_redis, shared_redis_url, unique_namespace

# The measurements, for `pytest tests/fleet -o log_cli=true --log-cli-level=INFO`.
logger = logging.getLogger(__name__)


class Heard:
    """A follower's notices, with the time each arrived."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.markers: list[str | None] = []
        self.event = asyncio.Event()

    def __call__(self, marker: str | None) -> None:
        self.markers.append(marker)
        self.times.append(time.perf_counter())
        self.event.set()

    async def next(self, seconds: float) -> float:
        await asyncio.wait_for(self.event.wait(), seconds)
        self.event.clear()
        return self.times[-1]


@contextlib.asynccontextmanager
async def following(fleet: Fleet, on_change: Callable[[str | None], None]) -> AsyncIterator[None]:
    task = asyncio.create_task(fleet.follow_changes(on_change))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def subscribed(redis: PrivateRedis) -> AsyncIterator[tuple[Fleet, Heard]]:
    """A publisher, and what a follower (subscribed by then) hears, on the private Redis."""
    namespace = unique_namespace()
    follower, publisher = open_fleet(redis.url, namespace=namespace), open_fleet(redis.url, namespace=namespace)
    heard = Heard()
    try:
        async with following(follower, heard):
            await heard.next(5)
            yield publisher, heard
    finally:
        await follower.close()
        await publisher.close()


async def publish_and_hear(publisher: Fleet, heard: Heard) -> None:
    sent = time.perf_counter()
    await publisher.publish_change("m1")
    assert await heard.next(1) - sent < 0.1


async def test_every_follower_hears_a_change_within_100_ms() -> None:
    url, namespace = shared_redis_url(), unique_namespace()
    publisher, *followers = [open_fleet(url, namespace=namespace) for _ in range(4)]
    heard = [Heard() for _ in followers]
    try:
        async with contextlib.AsyncExitStack() as stack:
            for fleet, ears in zip(followers, heard, strict=True):
                await stack.enter_async_context(following(fleet, ears))
            for ears in heard:
                await ears.next(5)  # subscribed (a subscription counts as a change: notices may have been missed)
            delays = []
            for _ in range(30):
                sent = time.perf_counter()
                await publisher.publish_change("m1")
                delays += [await ears.next(1) - sent for ears in heard]
        p50, p99 = statistics.median(delays), statistics.quantiles(delays, n=100)[98]
        logger.info("change notice delay over %d receipts: p50 %.2f ms, p99 %.2f ms", len(delays), p50 * 1e3, p99 * 1e3)
        assert max(delays) < 0.1, f"p50 {p50 * 1000:.1f} ms, max {max(delays) * 1000:.1f} ms"
        assert all(ears.markers == [None] + ["m1"] * 30 for ears in heard)  # subscribed, then each change's marker
    finally:
        for fleet in [publisher, *followers]:
            await fleet.close()


async def test_gateways_sharing_a_redis_hear_only_their_own_changes() -> None:
    url = shared_redis_url()
    mine, theirs = open_fleet(url, namespace=unique_namespace()), open_fleet(url, namespace=unique_namespace())
    heard = Heard()
    try:
        async with following(mine, heard):
            await heard.next(5)
            await theirs.publish_change("m1")
            with pytest.raises(TimeoutError):
                await heard.next(0.3)
    finally:
        await mine.close()
        await theirs.close()


async def test_a_follower_survives_redis_going_away_and_counts_its_return_as_a_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="credgate.fleet")
    with private_redis(tmp_path) as redis:
        async with subscribed(redis) as (publisher, heard):
            assert redis_up() == 1
            redis.stop()
            await publisher.publish_change("m1")  # never raises: polling the database carries the change
            await publisher.publish_change("m1")
            deadline = time.monotonic() + RETRY_SECONDS + 5
            while redis_up() != 0:  # what /metrics shows: credgate_dependency_up{dependency="redis"}
                assert time.monotonic() < deadline, "the follower never found Redis gone"
                await asyncio.sleep(0.05)
            redis.start()
            await heard.next(RETRY_SECONDS + 5)  # resubscribed: whatever was missed counts as changed
            await publish_and_hear(publisher, heard)
            assert redis_up() == 1
    messages = [record.getMessage() for record in caplog.records]
    assert (
        messages.count("could not publish a change through Redis (ConnectionError): other instances find it by polling")
        == 1
    )
    assert any(message.startswith("lost the change notices from Redis") for message in messages)
    assert "Redis answers again: change notices resumed" in messages


def redis_up() -> float | None:
    return REGISTRY.get_sample_value("credgate_dependency_up", {"dependency": "redis"})


def test_a_malformed_redis_url_is_refused_at_start_without_quoting_it() -> None:
    with pytest.raises(StartupError) as refused:
        open_fleet("http://user:hunter2-secret@example.com", namespace="n")
    assert "hunter2" not in str(refused.value)


async def test_a_follower_whose_redis_hangs_notices_within_seconds_and_resubscribes_when_it_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection that stays open but silent (a stopped server, a partition) is found out by a ping."""
    caplog.set_level(logging.WARNING, logger="credgate.fleet")
    with private_redis(tmp_path) as redis:
        async with subscribed(redis) as (publisher, heard):
            redis.pause()
            await asyncio.sleep(3.5)  # a second without a notice, a second for the ping's answer, and slack
            assert any(r.getMessage().startswith("lost the change notices from Redis") for r in caplog.records)
            redis.resume()
            await heard.next(RETRY_SECONDS + 5)  # resubscribed
            await publish_and_hear(publisher, heard)
