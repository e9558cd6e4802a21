"""The official `cerebras_cloud_sdk` through the gateway: its connection warm-up, chat completions plain and
streamed, a text completion (the `openai` SDK at Cerebras's `/v1`: test_openai_compatible)."""

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from cerebras.cloud.sdk import AsyncCerebras, AsyncStream
from cerebras.cloud.sdk.types.chat.chat_completion import ChatChunkResponse, ChatCompletionResponse
from cerebras.cloud.sdk.types.chat.completion_create_params import MessageUserMessageRequest
from cerebras.cloud.sdk.types.completion import CompletionResponse

from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.openai_shapes import ANSWER, STREAMED, assert_bearer_key, chat_handler
from tests.sdk.standin import StandIn, connect_template, run_stand_in

MODEL = "llama-3.3-70b"
MESSAGES: list[MessageUserMessageRequest] = [{"role": "user", "content": "hi"}]
# What Cerebras adds to the OpenAI shape: the serving system and how long each phase took, in seconds.
TIME_INFO = {"queue_time": 0.0001, "prompt_time": 0.002, "completion_time": 0.01, "total_time": 0.02}
TIMING = {"system_fingerprint": "fp_70185065a4", "time_info": TIME_INFO}
WARM_UP = "/v1/tcp_warming"


async def warm_up(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.Response(status=200)


async def complete(request: web.Request, body: bytes) -> web.StreamResponse:
    choice = {"index": 0, "text": " jumps over the lazy dog.", "finish_reason": "stop"}
    return web.json_response(
        {"id": "cmpl-1", "object": "text_completion", "created": 1_700_000_000, "model": MODEL, "choices": [choice]}
        | TIMING
    )


ROUTES = {
    ("GET", WARM_UP): warm_up,
    ("POST", "/v1/chat/completions"): chat_handler(TIMING),
    ("POST", "/v1/completions"): complete,
}


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in(ROUTES) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    key = await connect_template(ctx, project, stand_in, template="cerebras-chat-completions")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="cerebras", template_id="cerebras-completions", actor="tests"
    )
    return key


@pytest.fixture
async def client(gateway_url: str, project: Project, key: str) -> AsyncIterator[AsyncCerebras]:
    # Made as a user makes it. Its constructor warms the connection with a blocking call, so it runs in a
    # thread here, leaving this event loop (which serves the gateway) free to answer it.
    client = await asyncio.to_thread(
        AsyncCerebras, base_url=f"{gateway_url}/proxy/cerebras", api_key=project.token, max_retries=0, timeout=10
    )
    async with client:
        yield client


def assert_reached(stand_in: StandIn, path: str) -> None:
    """The warm-up, then the call, each at Cerebras's own path."""
    assert [(received.method, received.path_qs) for received in stand_in.received] == [
        ("GET", WARM_UP),
        ("POST", path),
    ]
    assert stand_in.unrouted == []


async def test_chat_completion(client: AsyncCerebras, stand_in: StandIn, project: Project, key: str) -> None:
    answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert isinstance(answer, ChatCompletionResponse)
    assert answer.choices[0].message.content == ANSWER
    assert answer.time_info is not None
    assert answer.time_info.total_time == TIME_INFO["total_time"]
    assert json.loads(stand_in.last.body)["messages"] == MESSAGES
    assert_reached(stand_in, "/v1/chat/completions")
    assert_bearer_key(stand_in, project, key)


async def test_streamed_chat_completion_arrives_chunk_by_chunk(
    client: AsyncCerebras, stand_in: StandIn, project: Project, key: str
) -> None:
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    assert isinstance(stream, AsyncStream)
    pieces = []
    async for chunk in stream:
        assert isinstance(chunk, ChatChunkResponse)
        assert chunk.choices is not None
        assert chunk.choices[0].delta is not None
        pieces.append(chunk.choices[0].delta.content)
    assert pieces == list(STREAMED)
    assert json.loads(stand_in.last.body)["stream"] is True
    assert_reached(stand_in, "/v1/chat/completions")
    assert_bearer_key(stand_in, project, key)


async def test_text_completion(client: AsyncCerebras, stand_in: StandIn, project: Project, key: str) -> None:
    completion = await client.completions.create(model=MODEL, prompt="The quick brown fox")
    assert isinstance(completion, CompletionResponse)
    assert completion.choices[0].text == " jumps over the lazy dog."
    assert json.loads(stand_in.last.body)["prompt"] == "The quick brown fox"
    assert_reached(stand_in, "/v1/completions")
    assert_bearer_key(stand_in, project, key)
