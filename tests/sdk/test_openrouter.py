"""The official `openrouter` SDK through the gateway: a bearer key, its attribution headers, chat plain and
streamed."""

import json
from collections.abc import AsyncIterator, Mapping

import pytest
from aiohttp import web
from openrouter import OpenRouter, components
from openrouter.utils.eventstreaming import EventStreamAsync

from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.standin import StandIn, assert_token_nowhere, connect_template, run_stand_in

MODEL = "openai/gpt-4o-mini"
MESSAGES: list[components.ChatMessagesTypedDict] = [{"role": "user", "content": "hi"}]
APP = {"HTTP-Referer": "https://app.example", "X-OpenRouter-Title": "Example app"}


def completion(choice: Mapping[str, object], *, chunk: bool) -> dict[str, object]:
    """A chat completion (or one streamed chunk of it) as OpenRouter documents it."""
    return {
        "id": "gen-1700000000-abcdef",
        "provider": "OpenAI",
        "model": MODEL,
        "object": "chat.completion.chunk" if chunk else "chat.completion",
        "created": 1_700_000_000,
        "system_fingerprint": None,
        "choices": [{"index": 0, "logprobs": None, **choice}],
        **({} if chunk else {"usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}}),
    }


async def chat(request: web.Request, body: bytes) -> web.StreamResponse:
    if not json.loads(body).get("stream"):
        message = {"role": "assistant", "content": "Hello!", "refusal": None, "reasoning": None}
        return web.json_response(completion({"message": message, "finish_reason": "stop"}, chunk=False))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b": OPENROUTER PROCESSING\n\n")  # the keep-alive comment OpenRouter documents
    for index, text in enumerate(("Hel", "lo", "!")):
        choice = {"delta": {"role": "assistant", "content": text}, "finish_reason": "stop" if index == 2 else None}
        await response.write(f"data: {json.dumps(completion(choice, chunk=True))}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in({("POST", "/api/v1/chat/completions"): chat}) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    return await connect_template(ctx, project, stand_in, template="openrouter-chat-completions")


@pytest.fixture
async def client(gateway_url: str, project: Project, key: str) -> AsyncIterator[OpenRouter]:
    async with OpenRouter(
        api_key=project.token,
        server_url=f"{gateway_url}/proxy/openrouter",
        http_referer=APP["HTTP-Referer"],
        x_open_router_title=APP["X-OpenRouter-Title"],
        retry_config=None,
        timeout_ms=10_000,
    ) as client:
        yield client


def assert_sent_as_documented(stand_in: StandIn, project: Project, key: str) -> None:
    received = stand_in.last
    assert received.path_qs == "/api/v1/chat/completions"
    assert [value for name, value in received.headers if name.lower() == "authorization"] == [f"Bearer {key}"]
    for header, expected in APP.items():
        assert [value for name, value in received.headers if name.lower() == header.lower()] == [expected]
    assert_token_nowhere(stand_in, project)


async def test_chat(client: OpenRouter, stand_in: StandIn, project: Project, key: str) -> None:
    result = await client.chat.send_async(model=MODEL, messages=MESSAGES)
    assert result.choices[0].message.content == "Hello!"
    assert result.usage is not None
    assert result.usage.total_tokens == 5
    assert_sent_as_documented(stand_in, project, key)


async def test_streamed_chat_arrives_chunk_by_chunk(
    client: OpenRouter, stand_in: StandIn, project: Project, key: str
) -> None:
    stream = await client.chat.send_async(model=MODEL, messages=MESSAGES, stream=True)
    assert isinstance(stream, EventStreamAsync)
    assert [chunk.choices[0].delta.content async for chunk in stream] == ["Hel", "lo", "!"]
    assert_sent_as_documented(stand_in, project, key)
