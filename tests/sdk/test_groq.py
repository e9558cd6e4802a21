"""The official `groq` SDK through the gateway (the `openai` SDK at Groq's `/openai/v1`: test_openai_compatible)."""

from collections.abc import AsyncIterator

import groq
import pytest
from aiohttp import web

from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.openai_shapes import chat
from tests.sdk.standin import StandIn, assert_token_nowhere, connect_template, run_stand_in

MODEL = "llama-3.3-70b-versatile"
AUDIO = b"RIFF\x24\x00\x00\x00WAVEfmt "


async def transcribe(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.json_response({"text": "Hello there.", "x_groq": {"id": "req_1"}})


ROUTES = {("POST", "/openai/v1/chat/completions"): chat, ("POST", "/openai/v1/audio/transcriptions"): transcribe}


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in(ROUTES) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    key = await connect_template(ctx, project, stand_in, template="groq-chat-completions")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="groq", template_id="groq-audio-transcriptions", actor="tests"
    )
    return key


@pytest.fixture
async def client(gateway_url: str, project: Project) -> AsyncIterator[groq.AsyncGroq]:
    base_url = f"{gateway_url}/proxy/groq"
    async with groq.AsyncGroq(api_key=project.token, base_url=base_url, max_retries=0, timeout=10) as client:
        yield client


def assert_key_placed(stand_in: StandIn, project: Project, key: str) -> None:
    assert [value for name, value in stand_in.last.headers if name.lower() == "authorization"] == [f"Bearer {key}"]
    assert_token_nowhere(stand_in, project)


async def test_chat_completion(client: groq.AsyncGroq, stand_in: StandIn, project: Project, key: str) -> None:
    completion = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert completion.choices[0].message.content == "Hello!"
    assert stand_in.last.path_qs == "/openai/v1/chat/completions"
    assert_key_placed(stand_in, project, key)


async def test_streamed_chat_completion_arrives_chunk_by_chunk(
    client: groq.AsyncGroq, stand_in: StandIn, project: Project, key: str
) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert [event.choices[0].delta.content async for event in stream] == ["Hel", "lo", "!"]
    assert stand_in.last.path_qs == "/openai/v1/chat/completions"
    assert_key_placed(stand_in, project, key)


async def test_audio_transcription_uploads_the_file(
    client: groq.AsyncGroq, stand_in: StandIn, project: Project, key: str
) -> None:
    transcription = await client.audio.transcriptions.create(file=("hello.wav", AUDIO), model="whisper-large-v3")
    assert transcription.text == "Hello there."
    assert stand_in.last.path_qs == "/openai/v1/audio/transcriptions"
    assert (stand_in.last.header("content-type") or "").startswith("multipart/form-data; boundary=")
    assert AUDIO in stand_in.last.body
    assert_key_placed(stand_in, project, key)
