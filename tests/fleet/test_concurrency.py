"""A project's cap on requests under way, counted once across processes through a real Redis, per process while
it is away, and freed by the leases of a process that died."""

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.types import Message

from credgate.fleet import Fleet, open_fleet
from credgate.fleet.concurrency import LocalPlaces, Place, SharedPlaces
from credgate.proxy.client import FreeingSend
from tests.redis_server import PrivateRedis, calls_sent, private_redis, unique_namespace


def places(fleets: list[Fleet], *, lease_seconds: float = 30.0) -> list[SharedPlaces]:
    return [SharedPlaces(fleet, LocalPlaces(), lease_seconds=lease_seconds) for fleet in fleets]


async def under_way(fleet: Fleet, project_id: str) -> int:
    """The project's places whose lease has not run out, by Redis's clock."""
    seconds, microseconds = await fleet.redis.time()
    now_ms = seconds * 1000 + microseconds // 1000
    return int(await fleet.redis.zcount(fleet.key("under-way", project_id), now_ms, "+inf"))


def test_in_one_process_the_cap_counts_requests_under_way_and_each_project_apart() -> None:
    local = LocalPlaces()
    taken = [local.take_now("p1", 2) for _ in range(3)]
    assert taken[:2] == [Place("p1"), Place("p1")]
    assert taken[2] is None
    assert local.take_now("p2", 2) == Place("p2")
    local.give_back(Place("p1"))
    assert local.take_now("p1", 2) == Place("p1")
    assert local.take_now("p1", 2) is None


async def test_three_processes_taking_at_once_share_one_cap_and_a_place_given_back_serves_the_next(
    fleets: list[Fleet],
) -> None:
    shared = places(fleets)
    taken = await asyncio.gather(*(shared[turn % 3].take("p1", 4) for turn in range(12)))
    held = [(turn % 3, place) for turn, place in enumerate(taken) if place is not None]
    assert len(held) == 4
    assert all(place.member is not None for _, place in held)  # counted in Redis, not in a process
    assert await under_way(fleets[0], "p1") == 4
    assert await shared[0].take("p2", 4) is not None  # another project counts apart

    owner, place = held[0]
    shared[owner].give_back(place)
    await shared[owner].aclose()  # the give-back is under way: wait for it
    assert await under_way(fleets[0], "p1") == 3
    # Closed, the owner counts in its process now: the next takers are the two others, whichever held first.
    first, second = (each for number, each in enumerate(shared) if number != owner)
    assert await first.take("p1", 4) is not None
    assert await second.take("p1", 4) is None
    for each in shared:
        await each.aclose()


async def test_a_turns_takes_and_give_backs_name_each_set_once_and_count_in_order(fleets: list[Fleet]) -> None:
    shared = places(fleets[:1])[0]
    takes, returns = calls_sent(shared, "_take"), calls_sent(shared, "_release")

    taken = await asyncio.gather(*(shared.take(f"p{turn % 2}", 3 + turn % 2) for turn in range(12)))

    # Each project's first places, in order: 3 for p0 (the even turns), 4 for p1.
    assert [turn for turn, place in enumerate(taken) if place is not None] == [*range(6), 7]
    assert (await under_way(fleets[0], "p0"), await under_way(fleets[0], "p1")) == (3, 4)
    for place in taken:
        if place is not None:
            shared.give_back(place)
    await shared.aclose()
    assert (await under_way(fleets[0], "p0"), await under_way(fleets[0], "p1")) == (0, 0)
    assert (takes, returns) == ([(2, 2)], [(2, 1)])  # each set once, the turn's places packed in one argument


async def test_the_places_of_a_process_that_died_free_at_their_lease_while_a_live_process_keeps_its_own(
    fleets: list[Fleet],
) -> None:
    living, dying = places(fleets[:2], lease_seconds=1.5)
    kept = await living.take("p1", 2)
    lost = await dying.take("p1", 2)
    assert kept is not None
    assert lost is not None
    assert await living.take("p1", 2) is None
    await dying.aclose()  # dies: gives nothing back, renews nothing more
    await asyncio.sleep(3.5)  # over two leases: the living process renewed its place meanwhile
    assert await under_way(fleets[0], "p1") == 1
    assert await living.take("p1", 2) is not None
    assert await living.take("p1", 2) is None
    await living.aclose()


async def test_a_place_redis_lost_is_put_back_at_the_next_renewal(fleets: list[Fleet]) -> None:
    """A Redis restarted empty, or an outage longer than a lease: the requests still under way count again."""
    shared = places(fleets, lease_seconds=1.5)[0]
    assert await shared.take("p1", 1) is not None
    await fleets[0].redis.delete(fleets[0].key("under-way", "p1"))
    assert await under_way(fleets[0], "p1") == 0
    await asyncio.sleep(1.0)  # a renewal (every 0.5 s) has come
    assert await under_way(fleets[0], "p1") == 1
    assert await shared.take("p1", 1) is None
    await shared.aclose()


async def test_a_request_that_leaves_while_its_place_is_asked_for_gives_it_back(fleets: list[Fleet]) -> None:
    shared, other = places(fleets)[:2]
    asking = asyncio.ensure_future(shared.take("p1", 1))
    await asyncio.sleep(0)  # joined the turn's batch
    asking.cancel()
    await asyncio.gather(asking, return_exceptions=True)
    await shared.aclose()  # the script's answer came, and its place went back
    assert await under_way(fleets[0], "p1") == 0
    place = await other.take("p1", 1)  # closed, `shared` counts in memory: another process asks Redis
    assert place is not None
    assert place.member is not None
    await other.aclose()


async def test_a_response_frees_its_place_for_every_process_before_its_last_message_goes(
    fleets: list[Fleet],
) -> None:
    """A client that sends its next request as soon as it has an answer must find the place free, on whichever
    instance that request reaches: the place is out of Redis before the response's last bytes leave."""
    shared, other = places(fleets)[:2]
    counted_at: list[tuple[bool, int]] = []

    async def client(message: Message) -> None:
        if message["type"] == "http.response.body":
            counted_at.append((message.get("more_body", False), await under_way(fleets[0], "p1")))

    place = await shared.take("p1", 1)
    assert place is not None
    send = FreeingSend(client, shared, place)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"data: 2\n\n"})
    assert counted_at == [(True, 1), (False, 0)]
    assert await other.take("p1", 1) is not None  # at once, in another process
    send.give_back()  # the request ends: its place went back already, and is not given back twice
    await shared.aclose()
    assert await under_way(fleets[0], "p1") == 1  # the other process's
    await other.aclose()


async def test_a_response_cut_off_before_its_end_gives_its_place_back_once() -> None:
    local = LocalPlaces()
    place = local.take_now("p1", 2)
    assert place is not None
    sent: list[Message] = []

    async def client(message: Message) -> None:
        sent.append(message)

    send = FreeingSend(client, local, place)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    assert local.take_now("p1", 2) is not None
    assert local.take_now("p1", 2) is None  # still held while the stream is under way
    send.give_back()
    send.give_back()
    assert [local.take_now("p1", 2) is not None for _ in range(2)] == [True, False]  # one place back, not two
    assert len(sent) == 2


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    with private_redis(tmp_path) as server:
        yield server


async def test_without_redis_places_are_counted_per_process_logged_once_and_given_back_where_taken(
    redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="credgate.fleet")
    fleet = open_fleet(redis.url, namespace=unique_namespace())
    try:
        shared = SharedPlaces(fleet, LocalPlaces())
        in_redis = await shared.take("p1", 2)
        assert in_redis is not None
        assert in_redis.member is not None
        redis.stop()
        # Never an exception: this process counts alone, from nothing, what it takes while Redis is away.
        local = [await shared.take("p1", 2) for _ in range(3)]
        assert [place is not None and place.member is None for place in local] == [True, True, False]
        assert [r.getMessage() for r in caplog.records].count(
            "Redis does not answer (ConnectionError): requests under way are counted per process until it does"
        ) == 1
        for place in local[:2]:
            assert place is not None
            shared.give_back(place)
        assert await shared.take("p1", 2) is not None  # given back to the count that took them
        # Not waited for while Redis is away (the takes keep the one call a second that tries it): its lease frees it.
        await asyncio.wait_for(shared.free(in_redis), 0.5)
        await shared.aclose()
    finally:
        await fleet.close()
