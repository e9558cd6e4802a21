"""The `openai` SDK against each OpenAI-compatible provider of the catalogue, at the base URL the provider
documents for it, moved onto the gateway: the template's base URL becomes `{gateway}/proxy/<provider>`."""

import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import openai
import pytest
from aiohttp import web

from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.standin import StandIn, assert_token_nowhere, connect_template, run_stand_in

# The base URL each provider documents for the openai SDK (DeepSeek documents both of its spellings).
DOCUMENTED = {
    "deepseek": "https://api.deepseek.com",
    "deepseek-v1": "https://api.deepseek.com/v1",
    "xai": "https://api.x.ai/v1",
    "perplexity": "https://api.perplexity.ai",
    "openrouter": "https://openrouter.ai/api/v1",
    "groq": "https://api.groq.com/openai/v1",
    "together": "https://api.together.xyz/v1",
    "mistral": "https://api.mistral.ai/v1",
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


@pytest.fixture(params=DOCUMENTED, ids=str)
def case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def provider_of(case: str) -> str:
    return case.removesuffix("-v1")


@pytest.fixture
async def stand_in(case: str) -> AsyncIterator[StandIn]:
    async with run_stand_in({("POST", f"{urlsplit(DOCUMENTED[case]).path}/chat/completions"): chat}) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn, case: str) -> str:
    return await connect_template(ctx, project, stand_in, template=f"{provider_of(case)}-chat-completions")


def gateway_base_url(ctx: Context, gateway_url: str, case: str) -> str:
    """The documented base URL with the template's base URL replaced by the gateway's `/proxy/<provider>`."""
    provider = provider_of(case)
    template, documented = urlsplit(ctx.templates[f"{provider}-chat-completions"].base_url), urlsplit(DOCUMENTED[case])
    assert documented.netloc == template.netloc
    assert f"{documented.path}/".startswith(f"{template.path.rstrip('/')}/"), "the template cannot reach this URL"
    return f"{gateway_url}/proxy/{provider}{documented.path.removeprefix(template.path.rstrip('/'))}"


@pytest.fixture
async def client(ctx: Context, gateway_url: str, project: Project, case: str) -> AsyncIterator[openai.AsyncOpenAI]:
    base_url = gateway_base_url(ctx, gateway_url, case)
    async with openai.AsyncOpenAI(base_url=base_url, api_key=project.token, max_retries=0, timeout=10) as client:
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
