"""Rate limits counted once across processes through a real Redis, and counted per process while it is away."""

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from credgate.fleet import Fleet, RateLimiter, SharedRateLimiter, open_fleet
from credgate.fleet.fleet import ANSWER_TIMEOUT_SECONDS, RETRY_SECONDS
from tests.redis_server import PrivateRedis, calls_sent, private_redis, shared_redis_url, unique_namespace


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    with private_redis(tmp_path) as server:
        yield server


@pytest.fixture
async def private(redis: PrivateRedis) -> AsyncIterator[tuple[Fleet, SharedRateLimiter]]:
    """A process's connection to the private Redis, and its shared limiter."""
    fleet = open_fleet(redis.url, namespace=unique_namespace())
    yield fleet, SharedRateLimiter(fleet, RateLimiter())
    await fleet.close()


async def script_calls(fleet: Fleet) -> int:
    stats = await fleet.redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))


def limiters(fleets: list[Fleet]) -> list[SharedRateLimiter]:
    return [SharedRateLimiter(fleet, RateLimiter()) for fleet in fleets]


async def test_a_burst_admits_exactly_the_limit_and_then_asks_to_wait_one_interval(fleets: list[Fleet]) -> None:
    limiter = limiters(fleets)[0]
    started = time.monotonic()
    waits = [await limiter.check("p1", 30) for _ in range(31)]
    elapsed = time.monotonic() - started
    assert waits[:30] == [0.0] * 30
    # A request every 60/30 s, less what refilled while the burst was asked (a loaded machine takes longer).
    assert 2.0 - elapsed - 0.05 < waits[30] <= 2.0


async def test_three_processes_share_one_count_even_when_they_ask_at_once(fleets: list[Fleet]) -> None:
    shared = limiters(fleets)
    waits = await asyncio.gather(*(shared[turn % 3].check("p1", 40) for turn in range(120)))
    assert sum(1 for wait in waits if wait == 0) == 40
    # Another project, and the same project of another gateway (namespace), count apart.
    assert await shared[1].check("p2", 40) == 0
    other = open_fleet(shared_redis_url(), namespace=unique_namespace())
    try:
        assert await SharedRateLimiter(other, RateLimiter()).check("p1", 40) == 0
    finally:
        await other.close()


async def test_the_shared_count_refills_like_the_local_bucket(fleets: list[Fleet]) -> None:
    limiter = limiters(fleets)[0]
    burst = await asyncio.gather(*(limiter.check("p1", 120) for _ in range(121)))  # one call: no time to refill
    assert burst.count(0) == 120  # a request every 0.5 s, a burst of a minute's worth
    await asyncio.sleep(0.6)
    assert await limiter.check("p1", 120) == 0  # 0.6 s refilled one request, not two
    assert await limiter.check("p1", 120) > 0


async def test_without_redis_requests_are_counted_per_process_logged_once_and_shared_again_when_it_is_back(
    redis: PrivateRedis, private: tuple[Fleet, SharedRateLimiter], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="credgate.fleet")
    fleet, limiter = private
    assert await limiter.check("p1", 5) == 0
    redis.stop()
    # Never an exception, never a wait for Redis: the local bucket (full, as it has seen nothing) decides.
    waits = [await limiter.check("p1", 5) for _ in range(6)]
    assert waits[:5] == [0.0] * 5
    assert waits[5] > 0
    assert [r.getMessage() for r in caplog.records].count(
        "Redis does not answer (ConnectionError): rate limits are counted per process until it does"
    ) == 1

    redis.start()  # empty: the shared count starts again
    await asyncio.sleep(RETRY_SECONDS + 0.1)
    waits = [await limiter.check("p1", 5) for _ in range(6)]
    assert waits[:5] == [0.0] * 5
    assert waits[5] > 0
    assert await fleet.redis.exists(fleet.key("rate", "p1")) == 1
    assert "Redis answers again: rate limits are shared again" in caplog.text


async def test_a_redis_that_accepts_but_never_answers_costs_a_request_at_most_the_answer_timeout(
    tmp_path: Path,
) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read(-1)

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    fleet = open_fleet(f"redis://127.0.0.1:{port}/0", namespace=unique_namespace())
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await SharedRateLimiter(fleet, RateLimiter()).check("p1", 5) == 0
        assert loop.time() - started < ANSWER_TIMEOUT_SECONDS + 0.5
    finally:
        await fleet.close()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_the_checks_of_one_turn_share_one_round_trip_and_each_still_counts(
    private: tuple[Fleet, SharedRateLimiter],
) -> None:
    fleet, limiter = private
    assert await limiter.check("warm", 10) == 0  # the script loaded, a connection open
    before = await script_calls(fleet)
    sent = calls_sent(limiter, "_script")
    waits = await asyncio.gather(*(limiter.check(f"p{turn % 2}", 30 + turn % 2) for turn in range(100)))
    assert await script_calls(fleet) - before == 1  # not a hundred
    assert sent == [(2, 1)]  # each project's key once, the checks packed in one argument
    # Counted in order, each by its project's own limit: 30 for p0 (the even turns), 31 for p1.
    assert [turn for turn, wait in enumerate(waits) if wait == 0] == [*range(60), 61]


async def test_a_redis_that_hangs_costs_one_wait_a_second_not_one_a_request(
    redis: PrivateRedis, private: tuple[Fleet, SharedRateLimiter], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="credgate.fleet")
    _, limiter = private
    loop = asyncio.get_running_loop()
    took: list[float] = []
    try:
        assert await limiter.check("p1", 10**6) == 0
        redis.pause()
        finish = loop.time() + 3
        while loop.time() < finish:
            started = loop.time()
            assert await limiter.check("p1", 10**6) == 0  # never refused, never failed: counted locally
            took.append(loop.time() - started)
            await asyncio.sleep(0.01)
    finally:
        redis.resume()
    slow = [seconds for seconds in took if seconds > 0.5]
    assert len(took) > 50
    assert len(slow) <= 5, slow  # the first, then one probe a second
    assert max(took) < ANSWER_TIMEOUT_SECONDS + 0.5
    assert "Redis does not answer (TimeoutError): rate limits are counted per process until it does" in caplog.text
