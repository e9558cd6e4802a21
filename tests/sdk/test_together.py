"""The official `together` SDK through the gateway (the `openai` SDK at Together's `/v1`: test_openai_compatible)."""

from collections.abc import AsyncIterator

import pytest
import together
from aiohttp import web

from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.openai_shapes import chat
from tests.sdk.standin import StandIn, assert_token_nowhere, connect_template, run_stand_in

MODEL = "meta-llama/Llama-3.3-70B-Instruct-Turbo"
IMAGE_MODEL = "black-forest-labs/FLUX.1-schnell"


async def generate_image(request: web.Request, body: bytes) -> web.StreamResponse:
    image = {"index": 0, "type": "url", "url": "https://images.test/1.png"}
    return web.json_response({"id": "img-1", "model": IMAGE_MODEL, "object": "list", "data": [image]})


ROUTES = {("POST", "/v1/chat/completions"): chat, ("POST", "/v1/images/generations"): generate_image}


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in(ROUTES) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    key = await connect_template(ctx, project, stand_in, template="together-chat-completions")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="together", template_id="together-image-generations", actor="tests"
    )
    return key


@pytest.fixture
async def client(gateway_url: str, project: Project) -> AsyncIterator[together.AsyncTogether]:
    base_url = f"{gateway_url}/proxy/together"
    async with together.AsyncTogether(api_key=project.token, base_url=base_url, max_retries=0, timeout=10) as client:
        yield client


def assert_key_placed(stand_in: StandIn, project: Project, key: str) -> None:
    assert [value for name, value in stand_in.last.headers if name.lower() == "authorization"] == [f"Bearer {key}"]
    assert_token_nowhere(stand_in, project)


async def test_chat_completion(client: together.AsyncTogether, stand_in: StandIn, project: Project, key: str) -> None:
    completion = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    message = completion.choices[0].message
    assert message is not None
    assert message.content == "Hello!"
    assert stand_in.last.path_qs == "/v1/chat/completions"
    assert_key_placed(stand_in, project, key)


async def test_streamed_chat_completion_arrives_chunk_by_chunk(
    client: together.AsyncTogether, stand_in: StandIn, project: Project, key: str
) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert [event.choices[0].delta.content async for event in stream] == ["Hel", "lo", "!"]
    assert stand_in.last.path_qs == "/v1/chat/completions"
    assert_key_placed(stand_in, project, key)


async def test_image_generation(client: together.AsyncTogether, stand_in: StandIn, project: Project, key: str) -> None:
    images = await client.images.generate(model=IMAGE_MODEL, prompt="a lighthouse")
    assert [image.url for image in images.data if image.type == "url"] == ["https://images.test/1.png"]
    assert stand_in.last.path_qs == "/v1/images/generations"
    assert_key_placed(stand_in, project, key)
