"""The official `deepgram-sdk` through the gateway: `Authorization: Token`, pre-recorded speech to text from bytes,
text to speech on v1 and v2, models."""

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web
from deepgram import AsyncDeepgramClient, DeepgramClientEnvironment

from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.standin import StandIn, assert_token_nowhere, connect_template, run_stand_in

# Loading its v1 and v2 clients, the SDK imports names the installed `websockets` deprecates, which warns.
pytestmark = [
    pytest.mark.filterwarnings("ignore:websockets.exceptions.InvalidStatusCode is deprecated"),
    pytest.mark.filterwarnings("ignore:websockets.legacy is deprecated"),
]
AUDIO = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(64)  # a recording, as the SDK uploads it: raw bytes
SPEECH = [b"ID3" + bytes(1021), bytes(range(256)) * 4]  # audio as text to speech answers it, in two writes
TRANSCRIPT = "hello world"


def transcription() -> dict[str, object]:
    """A pre-recorded transcription as the API documents it."""
    words = [
        {"word": word, "start": index * 0.5, "end": index * 0.5 + 0.4, "confidence": 0.99}
        for index, word in enumerate(TRANSCRIPT.split())
    ]
    return {
        "metadata": {
            "transaction_key": "deprecated",
            "request_id": "5d3b1c1e-0000-4000-8000-000000000000",
            "sha256": "0" * 64,
            "created": "2025-01-01T00:00:00.000Z",
            "duration": 1.0,
            "channels": 1,
            "models": ["1abfe86b-0000-4000-8000-000000000000"],
            "model_info": {"1abfe86b-0000-4000-8000-000000000000": {"name": "general-nova-3", "arch": "nova-3"}},
        },
        "results": {
            "channels": [{"alternatives": [{"transcript": TRANSCRIPT, "confidence": 0.99, "words": words}]}],
        },
    }


async def listen(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.json_response(transcription())


async def speak(request: web.Request, body: bytes) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "audio/mpeg"})
    await response.prepare(request)
    for chunk in SPEECH:
        await response.write(chunk)
    await response.write_eof()
    return response


async def models(request: web.Request, body: bytes) -> web.StreamResponse:
    model = {"name": "aura-2-thalia-en", "canonical_name": "aura-2-thalia-en", "uuid": "ecb76e9d-0000-4000-8000-0"}
    if request.match_info.get("model"):
        return web.json_response(model)
    return web.json_response({"stt": [], "tts": [model]})


ROUTES = {
    ("POST", "/v1/listen"): listen,
    ("POST", "/{version:v1|v2}/speak"): speak,
    ("GET", "/v1/models"): models,
    ("GET", "/v1/models/{model}"): models,
}


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in(ROUTES) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    key = await connect_template(ctx, project, stand_in, template="deepgram-listen")
    for template in ("deepgram-speak", "deepgram-models"):
        await integrations.add_template_integration(
            ctx, project_id=project.id, provider="deepgram", template_id=template, actor="tests"
        )
    return key


@pytest.fixture
async def client(gateway_url: str, project: Project, key: str) -> AsyncIterator[AsyncDeepgramClient]:
    proxy = f"{gateway_url}/proxy/deepgram"
    # credgate relays no WebSocket; the live APIs point at the gateway too, so the token never goes to Deepgram.
    live = proxy.replace("http", "ws", 1)
    environment = DeepgramClientEnvironment(base=proxy, production=live, agent=live, agent_rest=proxy)
    async with httpx.AsyncClient(timeout=10) as http:
        yield AsyncDeepgramClient(api_key=project.token, environment=environment, httpx_client=http, max_retries=0)


def assert_key_placed(stand_in: StandIn, project: Project, key: str) -> None:
    for received in stand_in.received:
        assert [value for name, value in received.headers if name.lower() == "authorization"] == [f"Token {key}"]
    assert_token_nowhere(stand_in, project)


async def test_prerecorded_audio_is_transcribed_from_bytes(
    client: AsyncDeepgramClient, stand_in: StandIn, project: Project, key: str
) -> None:
    result = await client.listen.v1.media.transcribe_file(request=AUDIO, model="nova-3", smart_format=True)
    assert result.results.channels[0].alternatives[0].transcript == TRANSCRIPT
    assert stand_in.last.path_qs == "/v1/listen?model=nova-3&smart_format=true"
    assert stand_in.last.header("content-type") == "application/octet-stream"
    assert stand_in.last.body == AUDIO
    assert_key_placed(stand_in, project, key)


async def test_speech_is_generated_with_aura_on_v1(
    client: AsyncDeepgramClient, stand_in: StandIn, project: Project, key: str
) -> None:
    audio = [chunk async for chunk in client.speak.v1.audio.generate(text="hi", model="aura-2-thalia-en")]
    assert b"".join(audio) == b"".join(SPEECH)
    assert stand_in.last.path_qs == "/v1/speak?model=aura-2-thalia-en"
    assert json.loads(stand_in.last.body) == {"text": "hi"}
    assert_key_placed(stand_in, project, key)


async def test_speech_is_generated_with_flux_on_v2(
    client: AsyncDeepgramClient, stand_in: StandIn, project: Project, key: str
) -> None:
    audio = [chunk async for chunk in client.speak.v2.audio.generate(text="hi", model="flux-alexis-en")]
    assert b"".join(audio) == b"".join(SPEECH)
    assert stand_in.last.path_qs == "/v2/speak?model=flux-alexis-en"
    assert_key_placed(stand_in, project, key)


async def test_models_are_listed_and_described(
    client: AsyncDeepgramClient, stand_in: StandIn, project: Project, key: str
) -> None:
    listed = await client.manage.v1.models.list()
    described = await client.manage.v1.models.get("aura-2-thalia-en")
    assert [model.name for model in listed.tts or []] == [described.name] == ["aura-2-thalia-en"]
    assert [received.path_qs for received in stand_in.received] == ["/v1/models", "/v1/models/aura-2-thalia-en"]
    assert_key_placed(stand_in, project, key)
