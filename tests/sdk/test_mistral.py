"""The official `mistralai` SDK through the gateway (the `openai` SDK at Mistral's `/v1`: test_openai_compatible)."""

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from mistralai.client import Mistral
from mistralai.client.models import UserMessageTypedDict

from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.openai_shapes import chat
from tests.sdk.standin import StandIn, assert_token_nowhere, connect_template, run_stand_in

MODEL = "mistral-small-latest"
MESSAGES: list[UserMessageTypedDict] = [{"role": "user", "content": "hi"}]


async def embed(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.json_response(
        {
            "id": "emb-1",
            "object": "list",
            "model": "mistral-embed",
            "data": [{"object": "embedding", "embedding": [0.25, -0.5], "index": 0}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 0, "total_tokens": 2},
        }
    )


ROUTES = {("POST", "/v1/chat/completions"): chat, ("POST", "/v1/embeddings"): embed}


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in(ROUTES) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    key = await connect_template(ctx, project, stand_in, template="mistral-chat-completions")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="mistral", template_id="mistral-embeddings", actor="tests"
    )
    return key


@pytest.fixture
async def mistral(gateway_url: str, project: Project) -> AsyncIterator[Mistral]:
    # The SDK retries only when given a retry config.
    async with Mistral(api_key=project.token, server_url=f"{gateway_url}/proxy/mistral", timeout_ms=10_000) as sdk:
        yield sdk


def assert_key_placed(stand_in: StandIn, project: Project, key: str) -> None:
    assert [value for name, value in stand_in.last.headers if name.lower() == "authorization"] == [f"Bearer {key}"]
    assert_token_nowhere(stand_in, project)


async def test_chat_complete(mistral: Mistral, stand_in: StandIn, project: Project, key: str) -> None:
    response = await mistral.chat.complete_async(model=MODEL, messages=MESSAGES)
    message = response.choices[0].message
    assert message is not None
    assert message.content == "Hello!"
    assert stand_in.last.path_qs == "/v1/chat/completions"
    assert_key_placed(stand_in, project, key)


async def test_chat_stream_arrives_event_by_event(
    mistral: Mistral, stand_in: StandIn, project: Project, key: str
) -> None:
    stream = await mistral.chat.stream_async(model=MODEL, messages=MESSAGES)
    assert [event.data.choices[0].delta.content async for event in stream] == ["Hel", "lo", "!"]
    assert stand_in.last.path_qs == "/v1/chat/completions"
    assert stand_in.last.header("accept") == "text/event-stream"
    assert_key_placed(stand_in, project, key)


async def test_embeddings(mistral: Mistral, stand_in: StandIn, project: Project, key: str) -> None:
    response = await mistral.embeddings.create_async(model="mistral-embed", inputs=["hi"])
    assert response.data[0].embedding == [0.25, -0.5]
    assert stand_in.last.path_qs == "/v1/embeddings"
    assert_key_placed(stand_in, project, key)
