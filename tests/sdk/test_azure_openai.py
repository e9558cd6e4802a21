"""The `openai` SDK's `AsyncAzureOpenAI` through the gateway, with `azure_endpoint` and with `base_url`."""

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp import web

from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.standin import StandIn, assert_token_nowhere, connect_template, run_stand_in
from tests.upstream import chat_completion

DEPLOYMENT = "gpt-4o-mini-prod"
API_VERSION = "2025-04-01-preview"  # not the template's default: the client's own version must reach Azure
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
FILTERED = {"hate": {"filtered": False, "severity": "safe"}, "violence": {"filtered": False, "severity": "safe"}}


def chunk(content: str, finish_reason: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": finish_reason}
    choice["content_filter_results"] = FILTERED
    event = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini"}
    return f"data: {json.dumps(event | {'choices': [choice]})}\n\n".encode()


# Azure's stream opens with the prompt's filter results and no choices, then OpenAI's chunks with their own.
PROMPT_FILTERED = {"id": "", "object": "", "created": 0, "model": "", "choices": []}
PROMPT_FILTERED["prompt_filter_results"] = [{"prompt_index": 0, "content_filter_results": FILTERED}]
STREAM = [f"data: {json.dumps(PROMPT_FILTERED)}\n\n".encode(), chunk("Hel"), chunk("lo"), chunk("!", "stop")]


async def chat(request: web.Request, body: bytes) -> web.StreamResponse:
    if "api-version" not in request.query:  # Azure answers nothing without one
        raise web.HTTPNotFound()
    if not json.loads(body).get("stream"):
        completion: dict[str, Any] = chat_completion("gpt-4o-mini")
        completion["choices"][0]["content_filter_results"] = FILTERED
        return web.json_response(completion)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in [*STREAM, b"data: [DONE]\n\n"]:
        await response.write(event)
    await response.write_eof()
    return response


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in({("POST", "/openai/deployments/{deployment}/chat/completions"): chat}) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    return await connect_template(ctx, project, stand_in, template="azure-openai-chat-completions")


@pytest.fixture(params=["azure_endpoint", "base_url"])
async def client(
    gateway_url: str, project: Project, request: pytest.FixtureRequest
) -> AsyncIterator[openai.AsyncAzureOpenAI]:
    """The client both ways Azure documents: the resource's endpoint, or a deployment's base URL."""
    gateway = f"{gateway_url}/proxy/azure-openai"
    if request.param == "azure_endpoint":
        client = openai.AsyncAzureOpenAI(
            azure_endpoint=gateway, api_key=project.token, api_version=API_VERSION, max_retries=0, timeout=10
        )
    else:
        client = openai.AsyncAzureOpenAI(
            base_url=f"{gateway}/openai/deployments/{DEPLOYMENT}",
            api_key=project.token,
            api_version=API_VERSION,
            max_retries=0,
            timeout=10,
        )
    async with client:
        yield client


def assert_placed(stand_in: StandIn, project: Project, key: str) -> None:
    """The key in `api-key` only, the client's `api-version` exactly once, the token nowhere."""
    received = stand_in.last
    assert received.path_qs == f"/openai/deployments/{DEPLOYMENT}/chat/completions?api-version={API_VERSION}"
    assert [value for name, value in received.headers if name.lower() == "api-key"] == [key]
    assert received.header("authorization") is None
    assert_token_nowhere(stand_in, project)


async def test_chat_completion(client: openai.AsyncAzureOpenAI, stand_in: StandIn, project: Project, key: str) -> None:
    completion = await client.chat.completions.create(model=DEPLOYMENT, messages=MESSAGES)
    assert completion.choices[0].message.content == "Hello!"
    assert_placed(stand_in, project, key)


async def test_streamed_chat_completion_arrives_chunk_by_chunk(
    client: openai.AsyncAzureOpenAI, stand_in: StandIn, project: Project, key: str
) -> None:
    stream = await client.chat.completions.create(model=DEPLOYMENT, messages=MESSAGES, stream=True)
    chunks = [chunk async for chunk in stream]
    assert [chunk.choices[0].delta.content for chunk in chunks if chunk.choices] == ["Hel", "lo", "!"]
    assert_placed(stand_in, project, key)
