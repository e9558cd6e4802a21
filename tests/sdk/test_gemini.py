"""The official `google-genai` SDK through the gateway: `x-goog-api-key`, its default API version and v1beta."""

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from google import genai

from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.standin import StandIn, assert_token_nowhere, connect_template, run_stand_in

# The SDK goes through aiohttp when it is installed, and subclasses its ClientSession, which aiohttp warns about.
pytestmark = pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")
MODEL = "gemini-2.5-flash"
VERSION = "{version:v1|v1beta}"


def generated(text: str) -> dict[str, object]:
    """A `GenerateContentResponse` as the Gemini API documents it."""
    return {
        "candidates": [{"content": {"parts": [{"text": text}], "role": "model"}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 3, "totalTokenCount": 5},
        "modelVersion": MODEL,
    }


async def generate(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.json_response(generated("Hello!"))


async def stream_generate(request: web.Request, body: bytes) -> web.StreamResponse:
    if request.query.get("alt") != "sse":  # without it the API answers one JSON array, which the SDK does not read
        raise web.HTTPNotFound()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for text in ("Hel", "lo", "!"):
        await response.write(f"data: {json.dumps(generated(text))}\r\n\r\n".encode())
    await response.write_eof()
    return response


async def list_models(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.json_response({"models": [{"name": f"models/{MODEL}", "displayName": "Gemini 2.5 Flash"}]})


ROUTES = {
    ("POST", f"/{VERSION}/models/{{model}}:generateContent"): generate,
    ("POST", f"/{VERSION}/models/{{model}}:streamGenerateContent"): stream_generate,
    ("GET", f"/{VERSION}/models"): list_models,
}


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in(ROUTES) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    key = await connect_template(ctx, project, stand_in, template="gemini-generate-content")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="gemini", template_id="gemini-models", actor="tests"
    )
    return key


def client(gateway_url: str, project: Project, api_version: str | None = None) -> genai.Client:
    """The SDK as the README shows it; it retries nothing unless told to, and the timeout is in milliseconds."""
    base_url = f"{gateway_url}/proxy/gemini"
    return genai.Client(
        api_key=project.token, http_options={"base_url": base_url, "api_version": api_version, "timeout": 10_000}
    )


@pytest.fixture(autouse=True)
def sdk_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's own defaults, whatever the machine's environment chooses."""
    for name in ("GOOGLE_GENAI_API_VERSION", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def assert_key_placed(stand_in: StandIn, project: Project, key: str) -> None:
    received = stand_in.last
    assert [value for name, value in received.headers if name.lower() == "x-goog-api-key"] == [key]
    assert received.header("authorization") is None
    assert "key=" not in received.path_qs
    assert_token_nowhere(stand_in, project)


async def test_generate_content_at_the_sdks_default_api_version(
    gateway_url: str, project: Project, stand_in: StandIn, key: str
) -> None:
    response = await client(gateway_url, project).aio.models.generate_content(model=MODEL, contents="hi")
    assert response.text == "Hello!"
    assert stand_in.last.path_qs == f"/v1/models/{MODEL}:generateContent"
    assert_key_placed(stand_in, project, key)


async def test_generate_content_on_v1beta(gateway_url: str, project: Project, stand_in: StandIn, key: str) -> None:
    beta = client(gateway_url, project, "v1beta")
    response = await beta.aio.models.generate_content(model=MODEL, contents="hi")
    assert response.text == "Hello!"
    assert stand_in.last.path_qs == f"/v1beta/models/{MODEL}:generateContent"
    assert_key_placed(stand_in, project, key)


async def test_streamed_generate_content_arrives_chunk_by_chunk(
    gateway_url: str, project: Project, stand_in: StandIn, key: str
) -> None:
    stream = await client(gateway_url, project).aio.models.generate_content_stream(model=MODEL, contents="hi")
    assert [chunk.text async for chunk in stream] == ["Hel", "lo", "!"]
    assert stand_in.last.path_qs == f"/v1/models/{MODEL}:streamGenerateContent?alt=sse"
    assert_key_placed(stand_in, project, key)


@pytest.mark.parametrize("version", ["v1", "v1beta"])
async def test_models_are_listed_on_either_api_version(
    gateway_url: str, project: Project, stand_in: StandIn, key: str, version: str
) -> None:
    pager = await client(gateway_url, project, version).aio.models.list()
    assert [model.name async for model in pager] == [f"models/{MODEL}"]
    assert stand_in.last.path_qs == f"/{version}/models"
    assert_key_placed(stand_in, project, key)
