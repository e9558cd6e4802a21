"""The official `openai` and `anthropic` SDKs, unchanged but for their base URL, through the gateway."""

import json
import secrets
import time
from collections.abc import AsyncIterator

import anthropic
import httpx
import openai
import pytest

from credgate.services import integrations
from credgate.services.context import Context
from credgate.services.integrations import IntegrationChanges
from credgate.specs import Endpoint, HeaderAuth
from tests.e2e.conftest import Project
from tests.secret_sweep import SWEEP
from tests.upstream import QUOTA_ERROR, Upstream

MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def openai_client(gateway_url: str, project: Project) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{gateway_url}/proxy/openai", api_key=project.token, max_retries=0
    ) as client:
        yield client


@pytest.fixture
async def anthropic_key(ctx: Context, upstream: Upstream, project: Project) -> str:
    """A custom `anthropic` integration in the same project: `x-api-key`, POST v1/messages."""
    key = "sk-ant-test-" + secrets.token_urlsafe(18)
    SWEEP.register(key)
    auth = HeaderAuth(method="header", name="x-api-key")
    await integrations.add_custom_integration(
        ctx, project_id=project.id, provider="anthropic", base_url=upstream.url, api_key=key, auth=auth, actor="t"
    )
    endpoints = [Endpoint(method="POST", path="v1/messages")]
    await integrations.set_endpoints(ctx, project_id=project.id, provider="anthropic", endpoints=endpoints, actor="t")
    return key


@pytest.fixture
async def anthropic_client(gateway_url: str, project: Project) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(
        base_url=f"{gateway_url}/proxy/anthropic", api_key=project.token, max_retries=0
    ) as client:
        yield client


def assert_key_not_token(upstream: Upstream, project: Project, header: str, expected: str) -> None:
    assert upstream.last.header(header) == expected
    assert project.token not in json.dumps(upstream.last.headers) + upstream.last.path_qs


# openai


async def test_openai_chat(openai_client: openai.AsyncOpenAI, upstream: Upstream, project: Project) -> None:
    completion = await openai_client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert completion.choices[0].message.content == "Hello!"
    assert completion.usage is not None
    assert completion.usage.total_tokens == 12
    assert_key_not_token(upstream, project, "authorization", f"Bearer {project.key}")


async def test_openai_streaming_chat_arrives_chunk_by_chunk(
    openai_client: openai.AsyncOpenAI, upstream: Upstream
) -> None:
    stream = await openai_client.chat.completions.create(
        model="gpt-4o", messages=MESSAGES, stream=True, extra_query={"delay": "0.3"}
    )
    words, arrivals = [], []
    async for chunk in stream:
        words.append(chunk.choices[0].delta.content)
        arrivals.append(time.monotonic())
    assert words == ["Hel", "lo", "!"]
    # The stand-in waits 0.3 s after each of the first two chunks: relayed unbuffered, they arrive apart (a relay that
    # held them would hand them over together). Not 0.2 s: a chunk held up on a loaded CI host (by 0.12 s once)
    # shortens the gap after it.
    assert arrivals[1] - arrivals[0] >= 0.1
    assert arrivals[2] - arrivals[1] >= 0.1


async def test_openai_images(openai_client: openai.AsyncOpenAI, upstream: Upstream, project: Project) -> None:
    images = await openai_client.images.generate(model="dall-e-3", prompt="a lighthouse")
    assert images.data is not None
    assert images.data[0].url == "https://images.test/1.png"
    assert upstream.last.path_qs == "/v1/images/generations"
    assert_key_not_token(upstream, project, "authorization", f"Bearer {project.key}")


@pytest.fixture
async def out_of_quota(ctx: Context, upstream: Upstream, project: Project) -> None:
    """The project's `openai` pointed at the stand-in's quota-exhausted account."""
    changes = IntegrationChanges(base_url=f"{upstream.url}/quota")
    await integrations.update_integration(ctx, project_id=project.id, provider="openai", changes=changes, actor="t")


@pytest.mark.usefixtures("out_of_quota")
async def test_provider_insufficient_quota_passes_through_unchanged(
    gateway_url: str, upstream: Upstream, project: Project
) -> None:
    body = {"model": "gpt-4o", "messages": MESSAGES}
    async with httpx.AsyncClient() as client:
        relayed = await client.post(
            f"{gateway_url}/proxy/openai/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {project.token}"},
        )
        direct = await client.post(f"{upstream.url}/quota/chat/completions", json=body)
    assert relayed.status_code == direct.status_code == 429
    assert relayed.content == direct.content
    assert relayed.json() == QUOTA_ERROR
    ignored = {"date", "x-request-id", "x-credgate-request-id"}
    assert [pair for pair in relayed.headers.multi_items() if pair[0] not in ignored] == [
        pair for pair in direct.headers.multi_items() if pair[0] not in ignored
    ]
    assert relayed.headers["retry-after"] == "20"
    assert "x-credgate-error" not in relayed.headers


@pytest.mark.usefixtures("out_of_quota")
async def test_openai_sdk_sees_the_providers_rate_limit_error(openai_client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as caught:
        await openai_client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert caught.value.status_code == 429
    assert caught.value.code == "insufficient_quota"
    assert caught.value.response.headers["retry-after"] == "20"
    assert "x-credgate-error" not in caught.value.response.headers


# anthropic


async def test_anthropic_messages(
    anthropic_client: anthropic.AsyncAnthropic, anthropic_key: str, upstream: Upstream, project: Project
) -> None:
    message = await anthropic_client.messages.create(
        model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hi!"
    assert message.usage.input_tokens == 7
    assert upstream.last.path_qs == "/v1/messages"
    assert upstream.last.header("anthropic-version") is not None
    assert [value for name, value in upstream.last.headers if name.lower() == "x-api-key"] == [anthropic_key]
    assert_key_not_token(upstream, project, "x-api-key", anthropic_key)


async def test_anthropic_streaming(
    anthropic_client: anthropic.AsyncAnthropic, anthropic_key: str, upstream: Upstream, project: Project
) -> None:
    async with anthropic_client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        events = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert "content_block_delta" in events
    assert events[-1] == "message_stop"
    assert final.content[0].type == "text"
    assert final.content[0].text == "Hi!"
    assert final.usage.output_tokens == 2
    assert_key_not_token(upstream, project, "x-api-key", anthropic_key)
