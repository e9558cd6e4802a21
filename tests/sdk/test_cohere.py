"""The official `cohere` SDK's v2 client through the gateway."""

import json
from collections.abc import AsyncIterator

import cohere
import pytest
from aiohttp import web

from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.standin import StandIn, assert_token_nowhere, connect_template, run_stand_in

MODEL = "command-a-03-2025"
MESSAGES: list[cohere.ChatMessageV2] = [cohere.UserChatMessageV2(content="hi")]
USAGE = {"billed_units": {"input_tokens": 2, "output_tokens": 3}, "tokens": {"input_tokens": 2, "output_tokens": 3}}
# A streamed v2 chat as Cohere documents it: named events, each with its `type` in the data as well.
STREAM = [
    ("message-start", '{"id":"c-1","type":"message-start","delta":{"message":{"role":"assistant","content":[]}}}'),
    ("content-start", '{"type":"content-start","index":0,"delta":{"message":{"content":{"type":"text","text":""}}}}'),
    ("content-delta", '{"type":"content-delta","index":0,"delta":{"message":{"content":{"text":"Hel"}}}}'),
    ("content-delta", '{"type":"content-delta","index":0,"delta":{"message":{"content":{"text":"lo!"}}}}'),
    ("content-end", '{"type":"content-end","index":0}'),
    ("message-end", '{"type":"message-end","delta":{"finish_reason":"COMPLETE"}}'),
]


async def chat(request: web.Request, body: bytes) -> web.StreamResponse:
    if not json.loads(body).get("stream"):
        message = {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]}
        return web.json_response({"id": "c-1", "finish_reason": "COMPLETE", "message": message, "usage": USAGE})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event, data in STREAM:
        await response.write(f"event: {event}\ndata: {data}\n\n".encode())
    await response.write_eof()
    return response


async def rerank(request: web.Request, body: bytes) -> web.StreamResponse:
    results = [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.1}]
    return web.json_response({"id": "r-1", "results": results, "meta": {"billed_units": {"search_units": 1}}})


async def describe_model(request: web.Request, body: bytes) -> web.StreamResponse:
    model = {"name": request.match_info["model"], "endpoints": ["chat"], "finetuned": False, "context_length": 256000}
    return web.json_response(model)


ROUTES = {
    ("POST", "/v2/chat"): chat,
    ("POST", "/v2/rerank"): rerank,
    ("GET", "/v1/models/{model}"): describe_model,
}


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in(ROUTES) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    key = await connect_template(ctx, project, stand_in, template="cohere-chat")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="cohere", template_id="cohere-rerank", actor="tests"
    )
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="cohere", template_id="cohere-models", actor="tests"
    )
    return key


@pytest.fixture
async def client(gateway_url: str, project: Project) -> AsyncIterator[cohere.AsyncClientV2]:
    base_url = f"{gateway_url}/proxy/cohere"
    async with cohere.AsyncClientV2(api_key=project.token, base_url=base_url, max_retries=0, timeout=10) as client:
        yield client


def assert_key_placed(stand_in: StandIn, project: Project, key: str) -> None:
    assert [value for name, value in stand_in.last.headers if name.lower() == "authorization"] == [f"Bearer {key}"]
    assert_token_nowhere(stand_in, project)


async def test_chat(client: cohere.AsyncClientV2, stand_in: StandIn, project: Project, key: str) -> None:
    response = await client.chat(model=MODEL, messages=MESSAGES)
    assert response.message.content is not None
    assert [item.text for item in response.message.content if item.type == "text"] == ["Hello!"]
    assert stand_in.last.path_qs == "/v2/chat"
    assert_key_placed(stand_in, project, key)


async def test_chat_stream_arrives_event_by_event(
    client: cohere.AsyncClientV2, stand_in: StandIn, project: Project, key: str
) -> None:
    stream = client.chat_stream(model=MODEL, messages=MESSAGES)
    events = [event async for event in stream]
    assert [event.type for event in events] == [event for event, _ in STREAM]
    texts = [event.delta.message.content.text for event in events if event.type == "content-delta"]  # type: ignore[union-attr]
    assert texts == ["Hel", "lo!"]
    assert stand_in.last.path_qs == "/v2/chat"
    assert_key_placed(stand_in, project, key)


async def test_rerank(client: cohere.AsyncClientV2, stand_in: StandIn, project: Project, key: str) -> None:
    response = await client.rerank(model="rerank-v3.5", query="lighthouse", documents=["sea", "lighthouse"])
    assert [result.index for result in response.results] == [1, 0]
    assert stand_in.last.path_qs == "/v2/rerank"
    assert_key_placed(stand_in, project, key)


async def test_the_v2_client_describes_a_model_on_v1(
    client: cohere.AsyncClientV2, stand_in: StandIn, project: Project, key: str
) -> None:
    model = await client.models.get(MODEL)
    assert model.name == MODEL
    assert stand_in.last.path_qs == f"/v1/models/{MODEL}"
    assert_key_placed(stand_in, project, key)
