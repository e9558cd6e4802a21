"""`GET /metrics`: Prometheus's text format behind the admin token, with the proxied requests counted by project,
provider and status, their durations, the gateway's own time, the tokens the provider reported, and no secret."""

import asyncio
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from credgate.services import admins
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.secret_sweep import SWEEP

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the exposition, by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_count_requests_by_project_provider_and_status_and_hold_no_secret(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    admin_token = await admins.create_admin_token(ctx, name="metrics", actor="t")
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
        before = samples((await client.get("/metrics", headers={"authorization": f"Bearer {admin_token}"})).text)
        bearer = {"authorization": f"Bearer {project.token}"}
        for _ in range(3):
            assert (await client.post("/proxy/openai/chat/completions", json=CHAT, headers=bearer)).status_code == 200
        made_up = await client.post("/proxy/no-such-provider/anything", json=CHAT, headers=bearer)
        assert made_up.status_code == 404
        refused = await client.get("/metrics")
        wrong = await client.get("/metrics", headers={"authorization": "Bearer cga_wrong"})
        deadline = time.monotonic() + 5
        while True:  # the tokens are counted when the usage recorder reads the responses, a moment later
            answer = await client.get("/metrics", headers={"authorization": f"Bearer {admin_token}"})
            after = samples(answer.text)
            # all three responses read (the recorder may write them in more than one batch), or the time is up
            if value(after, "credgate_tokens_total", project=project.id, provider="openai", kind="prompt") >= 3 * 9 or (
                time.monotonic() > deadline
            ):
                break
            await asyncio.sleep(0.1)
    assert (refused.status_code, wrong.status_code) == (401, 401)
    assert answer.headers["content-type"].startswith("text/plain")
    SWEEP.capture("metrics", answer.text)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert value(after, "credgate_requests_total", project=project.id, provider="openai", status="200") == 3
    # A provider the project has not set up is no label of its own: a client cannot make up label values.
    assert value(after, "credgate_requests_total", project=project.id, provider="-", status="404") == 1
    assert not any("no-such-provider" in str(labels) for _, labels in after)
    assert delta("credgate_request_duration_seconds_count", provider="openai") == 3
    assert delta("credgate_overhead_duration_seconds_count") >= 4
    assert value(after, "credgate_tokens_total", project=project.id, provider="openai", kind="prompt") == 3 * 9
    assert value(after, "credgate_tokens_total", project=project.id, provider="openai", kind="completion") == 3 * 3
    assert delta("credgate_access_lookups_total", result="miss") >= 2  # the first of each provider
    assert delta("credgate_access_lookups_total", result="hit") >= 2
    assert value(after, "credgate_in_flight_requests") == 0
    assert project.token not in answer.text
    assert project.key not in answer.text
    assert admin_token not in answer.text
