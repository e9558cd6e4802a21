"""Key pools in one process: what they record in the background is finished before the gateway closes."""

import asyncio

from credgate.proxy.key_pools import KeyPools
from tests.fleet.test_resting import POOL, Answer


async def test_a_key_refused_just_before_a_stop_is_recorded_out_of_service_before_the_pools_close() -> None:
    recorded: list[tuple[str, str]] = []

    async def take_out(project_id: str, provider: str, key_id: str, failure: str) -> None:
        await asyncio.sleep(0.05)  # a database write
        recorded.append((key_id, failure))

    pools = KeyPools(take_out)
    assert pools.passes_over("p", POOL, POOL.keys[0], Answer(401), last=False)  # type: ignore[arg-type]
    await pools.aclose()
    assert recorded == [("key_aaaa", "refused by the provider (401)")]
