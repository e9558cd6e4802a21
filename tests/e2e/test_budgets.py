"""Budgets on real sockets: requests counted at admission, tokens and cost settled from the usage each response
reported (streams included), 402 once spent, and the spend kept across a restart (read back from the request log).
"""

import asyncio
from collections.abc import Mapping

import httpx
import pytest
from prometheus_client import REGISTRY

from credgate.app import create_app
from credgate.config import Settings
from credgate.services import budgets, usage
from credgate.services.context import Context
from tests.e2e.conftest import Project, add_custom, serving
from tests.upstream import Upstream

CHAT: Mapping[str, object] = {"model": "gpt-4o-2024-08-06", "messages": [{"role": "user", "content": "hi"}]}
STREAMED = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
# The stand-in reports 9 + 3 tokens for a JSON answer, 5 + 3 for a stream asking for its usage.
PRICES = [{"model": "gpt-4o-mini*", "input": 0.15, "output": 0.6}, {"model": "gpt-4o*", "input": 1000, "output": 2000}]


async def chat(gateway_url: str, project: Project, body: Mapping[str, object] = CHAT) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
        return await client.post(
            "/proxy/openai/chat/completions", headers={"authorization": f"Bearer {project.token}"}, json=body
        )


async def settled(ctx: Context, project: Project, count: int) -> None:
    """Wait until `count` requests are in the request log: their usage has been settled by then."""
    for _ in range(200):
        if len(await usage.list_request_records(ctx, project_id=project.id)) >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"fewer than {count} requests were recorded")


def refusals(project: Project) -> float:
    return REGISTRY.get_sample_value("credgate_budget_refusals_total", {"project": project.id}) or 0


async def test_a_requests_budget_admits_exactly_its_limit_then_402_until_the_period_resets(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await budgets.add_budget(ctx, project_id=project.id, metric="requests", limit=3, period="day", actor="t")

    answers = [await chat(gateway_url, project) for _ in range(5)]

    assert [answer.status_code for answer in answers] == [200, 200, 200, 402, 402]
    refused = answers[3]
    message = refused.json()["error"]["message"]
    assert message.startswith("budget of 3 requests a day spent; it resets at ")
    assert message.endswith("T00:00:00Z")
    assert 1 <= int(refused.headers["retry-after"]) <= 86400
    assert refused.headers["x-credgate-error"]
    assert len(upstream.received) == 3  # a refused request never reaches the provider
    assert refusals(project) == 2


async def test_a_tokens_budget_is_settled_from_each_responses_usage(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    await budgets.add_budget(ctx, project_id=project.id, metric="tokens", limit=20, period="month", actor="t")

    assert (await chat(gateway_url, project)).status_code == 200  # 12 tokens: 12 of 20
    await settled(ctx, project, 1)
    assert (await chat(gateway_url, project)).status_code == 200  # admitted under the limit: 24 of 20
    await settled(ctx, project, 2)
    assert (await chat(gateway_url, project)).status_code == 402

    [state] = await budgets.list_budgets(ctx, project_id=project.id)
    assert state.spent == 24


async def test_a_streamed_call_is_priced_and_settled_from_its_final_usage_event(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    await budgets.set_prices(ctx, project_id=project.id, provider="openai", prices=PRICES, actor="t")
    await budgets.add_budget(ctx, project_id=project.id, metric="cost", limit=0.02, period="day", actor="t")

    first = await chat(gateway_url, project, STREAMED)
    assert first.status_code == 200
    assert first.text.endswith("data: [DONE]\n\n")
    await settled(ctx, project, 1)
    [record] = await usage.list_request_records(ctx, project_id=project.id)
    # 5 input tokens at $1000 and 3 output at $2000 per million, by the second line (the first does not match).
    assert (record.model, record.cost_micros) == ("gpt-4o-2024-08-06", 11_000)
    assert (await chat(gateway_url, project, STREAMED)).status_code == 200  # $0.011 of $0.02: admitted
    await settled(ctx, project, 2)
    assert (await chat(gateway_url, project, STREAMED)).status_code == 402  # $0.022 spent

    [state] = await budgets.list_budgets(ctx, project_id=project.id)
    assert state.spent == 22_000


async def test_the_spend_survives_a_restart_it_is_read_back_from_the_request_log(
    settings: Settings, ctx: Context, project: Project
) -> None:
    await budgets.add_budget(ctx, project_id=project.id, metric="requests", limit=2, period="day", actor="t")
    settings = settings.model_copy(update={"allow_private_upstreams": True})
    async with serving(create_app(settings, context=ctx), settings) as url:
        assert [(await chat(url, project)).status_code for _ in range(2)] == [200, 200]
    async with serving(create_app(settings, context=ctx), settings) as url:  # a new process's counters
        assert (await chat(url, project)).status_code == 402


async def test_a_budget_of_one_provider_leaves_the_others_alone_and_a_raised_limit_admits_at_once(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_custom(ctx, project, "second", upstream.url)
    budget = await budgets.add_budget(
        ctx, project_id=project.id, metric="requests", limit=1, period="day", provider="openai", actor="t"
    )

    async def other() -> int:
        async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
            headers = {"authorization": f"Bearer {project.token}"}
            return (await client.get("/proxy/second/echo/x", headers=headers)).status_code

    assert [(await chat(gateway_url, project)).status_code for _ in range(2)] == [200, 402]
    assert [await other() for _ in range(3)] == [200, 200, 200]
    await budgets.update_budget(ctx, project_id=project.id, budget_id=budget.id, limit=2, actor="t")
    assert [(await chat(gateway_url, project)).status_code for _ in range(2)] == [200, 402]
    await budgets.remove_budget(ctx, project_id=project.id, budget_id=budget.id, actor="t")
    assert (await chat(gateway_url, project)).status_code == 200


@pytest.mark.parametrize(
    ("metric", "limit", "problem"),
    [
        ("requests", 1.5, "limit: must be a whole number of requests"),
        ("tokens", 0, "limit: must be from 1 to 1,000,000,000,000,000"),
        ("cost", 0.001, "limit: must be from 0.01 to 1,000,000,000 dollars"),
        ("cost", float("nan"), "limit: must be a number of dollars"),
        ("dollars", 5, "metric: must be requests, tokens or cost"),
    ],
)
async def test_a_budget_that_makes_no_sense_is_refused_naming_the_field(
    ctx: Context, project: Project, metric: str, limit: float, problem: str
) -> None:
    with pytest.raises(Exception, match=problem):
        await budgets.add_budget(ctx, project_id=project.id, metric=metric, limit=limit, period="day", actor="t")
    assert await budgets.list_budgets(ctx, project_id=project.id) == []


async def test_only_requests_that_pass_every_check_count_against_a_requests_budget(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    await budgets.add_budget(ctx, project_id=project.id, metric="requests", limit=2, period="day", actor="t")
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
        headers = {"authorization": f"Bearer {project.token}"}
        assert (await client.get("/proxy/openai/models", headers=headers)).status_code == 403  # not allowed
    assert (await chat(gateway_url, project)).status_code == 200
    await settled(ctx, project, 2)

    [state] = await budgets.list_budgets(ctx, project_id=project.id)
    assert state.spent == 1  # the refused call is in the request log, but was never admitted


async def test_a_reserve_per_request_keeps_calls_in_flight_from_overrunning_a_tokens_budget_together(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    # Each call reports 12 tokens; 12 are held from its admission until then: 4 fit in 50, however many at once.
    await budgets.add_budget(ctx, project_id=project.id, metric="tokens", limit=50, period="day", reserve=12, actor="t")

    answers = await asyncio.gather(*(chat(gateway_url, project) for _ in range(10)))

    assert sorted(answer.status_code for answer in answers) == [200] * 4 + [402] * 6
    await settled(ctx, project, 10)
    [state] = await budgets.list_budgets(ctx, project_id=project.id)
    assert state.spent == 48  # what the four reported: each settled to its usage, its reserve released
    assert (await chat(gateway_url, project)).status_code == 402  # 48 + 12 held would pass 50
