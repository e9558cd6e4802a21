"""The `openai` SDK against each OpenAI-compatible provider of the catalogue: given the gateway's base URL that
stands for the one the provider documents for the openai SDK, it reaches the provider's real path."""

import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import openai
import pytest
from aiohttp import web

from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.standin import StandIn, assert_token_nowhere, connect_template, run_stand_in

# The base URL each provider documents for the openai SDK, and the one to give it through the gateway (the
# README's table); DeepSeek documents two.
CASES = {
    "deepseek": ("https://api.deepseek.com", "/proxy/deepseek"),
    "deepseek-v1": ("https://api.deepseek.com/v1", "/proxy/deepseek/v1"),
    "xai": ("https://api.x.ai/v1", "/proxy/xai"),
    "perplexity": ("https://api.perplexity.ai", "/proxy/perplexity"),
    "openrouter": ("https://openrouter.ai/api/v1", "/proxy/openrouter"),
    "groq": ("https://api.groq.com/openai/v1", "/proxy/groq/openai/v1"),
    "together": ("https://api.together.xyz/v1", "/proxy/together/v1"),
    "mistral": ("https://api.mistral.ai/v1", "/proxy/mistral/v1"),
}
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def completion(model: str, message: dict[str, str], *, chunk: bool = False) -> dict[str, object]:
    """A chat completion (or one streamed chunk of it) in the shape OpenAI documents."""
    choice: dict[str, object] = {"index": 0, "finish_reason": None if chunk else "stop"}
    choice["delta" if chunk else "message"] = message
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk" if chunk else "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [choice],
        **({} if chunk else {"usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}}),
    }


async def chat(request: web.Request, body: bytes) -> web.StreamResponse:
    sent = json.loads(body)
    if not sent.get("stream"):
        return web.json_response(completion(sent["model"], {"role": "assistant", "content": "Hello!"}))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for text in ("Hel", "lo", "!"):
        chunk = completion(sent["model"], {"role": "assistant", "content": text}, chunk=True)
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


@pytest.fixture(params=CASES, ids=str)
def case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def stand_in(case: str) -> AsyncIterator[StandIn]:
    documented, _ = CASES[case]
    async with run_stand_in({("POST", f"{urlsplit(documented).path}/chat/completions"): chat}) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn, case: str) -> str:
    provider = case.removesuffix("-v1")
    documented, _ = CASES[case]
    assert urlsplit(ctx.templates[f"{provider}-chat-completions"].base_url).netloc == urlsplit(documented).netloc
    return await connect_template(ctx, project, stand_in, template=f"{provider}-chat-completions")


@pytest.fixture
async def client(gateway_url: str, project: Project, case: str) -> AsyncIterator[openai.AsyncOpenAI]:
    _, through_gateway = CASES[case]
    async with openai.AsyncOpenAI(
        base_url=gateway_url + through_gateway, api_key=project.token, max_retries=0, timeout=10
    ) as client:
        yield client


def assert_bearer_key(stand_in: StandIn, project: Project, key: str) -> None:
    assert [value for name, value in stand_in.last.headers if name.lower() == "authorization"] == [f"Bearer {key}"]
    assert_token_nowhere(stand_in, project)


async def test_chat_completion(client: openai.AsyncOpenAI, stand_in: StandIn, project: Project, key: str) -> None:
    answer = await client.chat.completions.create(model="some-model", messages=MESSAGES)
    assert answer.choices[0].message.content == "Hello!"
    assert answer.usage is not None
    assert answer.usage.total_tokens == 5
    assert json.loads(stand_in.last.body)["messages"] == MESSAGES
    assert_bearer_key(stand_in, project, key)


async def test_streamed_chat_completion_arrives_chunk_by_chunk(
    client: openai.AsyncOpenAI, stand_in: StandIn, project: Project, key: str
) -> None:
    stream = await client.chat.completions.create(model="some-model", messages=MESSAGES, stream=True)
    assert [chunk.choices[0].delta.content async for chunk in stream] == ["Hel", "lo", "!"]
    assert_bearer_key(stand_in, project, key)
