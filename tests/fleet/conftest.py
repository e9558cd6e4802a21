"""Fleet fixtures: several processes' connections to one Redis."""

from collections.abc import AsyncIterator

import pytest

from credgate.fleet import Fleet, open_fleet
from tests.redis_server import shared_redis_url, unique_namespace


@pytest.fixture
async def fleets() -> AsyncIterator[list[Fleet]]:
    """Three processes' connections to the machine's Redis, sharing one fresh namespace."""
    url, namespace = shared_redis_url(), unique_namespace()
    opened = [open_fleet(url, namespace=namespace) for _ in range(3)]
    yield opened
    keys = [key async for key in opened[0].redis.scan_iter(match=f"{namespace}:*")]
    if keys:
        await opened[0].redis.delete(*keys)
    for fleet in opened:
        await fleet.close()
