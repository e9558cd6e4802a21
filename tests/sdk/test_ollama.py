"""The official `ollama` SDK through the gateway to Ollama's cloud API, with the key as a bearer token: native chat
plain and streamed (NDJSON), embeddings and the model list. The SDK takes the key as an `Authorization` header
or from `OLLAMA_API_KEY`; both carry the project token here. The `openai` SDK at Ollama's `/v1`:
test_openai_compatible."""

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from ollama import AsyncClient

from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.openai_shapes import ANSWER, STREAMED, assert_bearer_key
from tests.sdk.standin import StandIn, connect_template, run_stand_in

MODEL = "gpt-oss:120b"
MESSAGES = [{"role": "user", "content": "hi"}]
EMBEDDING = [0.25, -0.5, 0.125]
TIMINGS = {  # nanoseconds and token counts, as Ollama ends every answer
    "total_duration": 5_191_566_416,
    "load_duration": 2_154_458,
    "prompt_eval_count": 26,
    "prompt_eval_duration": 383_809_000,
    "eval_count": 3,
    "eval_duration": 4_799_921_000,
}


def chat_message(content: str, *, done: bool) -> dict[str, object]:
    message = {
        "model": MODEL,
        "created_at": "2025-10-17T23:14:07.414671Z",
        "message": {"role": "assistant", "content": content},
    }
    return message | ({"done": True, "done_reason": "stop", **TIMINGS} if done else {"done": False})


async def chat(request: web.Request, body: bytes) -> web.StreamResponse:
    if not json.loads(body).get("stream", True):  # Ollama streams unless told not to
        return web.json_response(chat_message(ANSWER, done=True))
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    for piece in STREAMED:
        await response.write(json.dumps(chat_message(piece, done=False)).encode() + b"\n")
    await response.write(json.dumps(chat_message("", done=True)).encode() + b"\n")
    await response.write_eof()
    return response


async def embed(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.json_response({"model": MODEL, "embeddings": [EMBEDDING], **TIMINGS})


async def tags(request: web.Request, body: bytes) -> web.StreamResponse:
    details = {
        "format": "",
        "family": "gptoss",
        "families": None,
        "parameter_size": "116.8B",
        "quantization_level": "MXFP4",
    }
    model = {
        "name": MODEL,
        "model": MODEL,
        "modified_at": "2025-08-05T00:00:00Z",
        "size": 65_369_818_941,
        "digest": "a951a23b46a1",
        "details": details,
    }
    return web.json_response({"models": [model]})


ROUTES = {("POST", "/api/chat"): chat, ("POST", "/api/embed"): embed, ("GET", "/api/tags"): tags}


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in(ROUTES) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    key = await connect_template(ctx, project, stand_in, template="ollama-chat")
    for template in ("ollama-embed", "ollama-models"):
        await integrations.add_template_integration(
            ctx, project_id=project.id, provider="ollama", template_id=template, actor="tests"
        )
    return key


@pytest.fixture(params=["header", "OLLAMA_API_KEY"])
async def client(
    request: pytest.FixtureRequest, gateway_url: str, project: Project, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[AsyncClient]:
    host = f"{gateway_url}/proxy/ollama"
    if request.param == "header":
        monkeypatch.delenv("OLLAMA_API_KEY", raising=False)
        sdk = AsyncClient(host=host, headers={"Authorization": f"Bearer {project.token}"}, timeout=10)
    else:
        monkeypatch.setenv("OLLAMA_API_KEY", project.token)
        sdk = AsyncClient(host=host, timeout=10)
    async with sdk:
        yield sdk


def assert_reached(stand_in: StandIn, method: str, path: str) -> None:
    assert [(received.method, received.path_qs) for received in stand_in.received] == [(method, path)]
    assert stand_in.unrouted == []


async def test_chat(client: AsyncClient, stand_in: StandIn, project: Project, key: str) -> None:
    response = await client.chat(model=MODEL, messages=MESSAGES, stream=False)
    assert response.message.content == ANSWER
    assert response.done_reason == "stop"
    assert response.eval_count == TIMINGS["eval_count"]
    assert json.loads(stand_in.last.body)["messages"] == MESSAGES
    assert_reached(stand_in, "POST", "/api/chat")
    assert_bearer_key(stand_in, project, key)


async def test_streamed_chat_arrives_line_by_line(
    client: AsyncClient, stand_in: StandIn, project: Project, key: str
) -> None:
    parts = [part async for part in await client.chat(model=MODEL, messages=MESSAGES, stream=True)]
    assert [part.message.content for part in parts] == [*STREAMED, ""]
    assert [part.done for part in parts] == [False, False, False, True]
    assert json.loads(stand_in.last.body)["stream"] is True
    assert_reached(stand_in, "POST", "/api/chat")
    assert_bearer_key(stand_in, project, key)


async def test_embed(client: AsyncClient, stand_in: StandIn, project: Project, key: str) -> None:
    response = await client.embed(model=MODEL, input="hi")
    assert [list(vector) for vector in response.embeddings] == [EMBEDDING]
    assert_reached(stand_in, "POST", "/api/embed")
    assert_bearer_key(stand_in, project, key)


async def test_list_models(client: AsyncClient, stand_in: StandIn, project: Project, key: str) -> None:
    response = await client.list()
    assert [model.model for model in response.models] == [MODEL]
    assert_reached(stand_in, "GET", "/api/tags")
    assert_bearer_key(stand_in, project, key)
