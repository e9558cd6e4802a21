"""The official `elevenlabs` SDK through the gateway: `xi-api-key`, text to speech whole, streamed and with
timestamps, voices on v1 and v2, models."""

import asyncio
import base64
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web
from elevenlabs import AsyncElevenLabs
from elevenlabs.core import RequestOptions

from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.standin import Handler, StandIn, assert_token_nowhere, connect_template, run_stand_in

VOICE = "JBFqnCBsd6RMkjVDRZzb"
MODEL = "eleven_multilingual_v2"
AUDIO = [bytes([n]) * 1024 for n in range(3)]  # three 1 KiB chunks: the SDK hands audio over in 1 KiB pieces
NO_RETRY: RequestOptions = {"max_retries": 0}


def alignment(text: str) -> dict[str, object]:
    """Character timestamps as the API documents them."""
    return {
        "characters": list(text),
        "character_start_times_seconds": [0.1 * index for index in range(len(text))],
        "character_end_times_seconds": [0.1 * (index + 1) for index in range(len(text))],
    }


def timestamped(text: str, audio: bytes) -> dict[str, object]:
    return {
        "audio_base64": base64.b64encode(audio).decode(),
        "alignment": alignment(text),
        "normalized_alignment": None,
    }


async def speech(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.Response(body=b"".join(AUDIO), content_type="audio/mpeg")


async def speech_with_timestamps(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.json_response(timestamped("hi", b"".join(AUDIO)))


async def streamed_speech_with_timestamps(request: web.Request, body: bytes) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    for text, audio in zip("hi", AUDIO, strict=False):  # one JSON object a line
        await response.write(json.dumps(timestamped(text, audio)).encode() + b"\n")
    await response.write_eof()
    return response


def streamed_speech(wanted: asyncio.Event) -> Handler:
    async def stream(request: web.Request, body: bytes) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "audio/mpeg"})
        await response.prepare(request)
        for chunk in AUDIO:
            await response.write(chunk)
            # The next chunk waits until the client holds this one: a relay that buffered would stall here.
            await asyncio.wait_for(wanted.wait(), 5)
            wanted.clear()
        await response.write_eof()
        return response

    return stream


async def voices(request: web.Request, body: bytes) -> web.StreamResponse:
    found = [{"voice_id": VOICE, "name": "George", "category": "premade"}]
    if request.path.startswith("/v2/"):
        return web.json_response({"voices": found, "has_more": False, "total_count": 1, "next_page_token": None})
    return web.json_response({"voices": found})


async def models(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.json_response([{"model_id": MODEL, "name": "Eleven Multilingual v2", "can_do_text_to_speech": True}])


@pytest.fixture
def wanted() -> asyncio.Event:
    """Set by a test when it holds the streamed chunk it last received."""
    return asyncio.Event()


@pytest.fixture
async def stand_in(wanted: asyncio.Event) -> AsyncIterator[StandIn]:
    routes = {
        ("POST", "/v1/text-to-speech/{voice}"): speech,
        ("POST", "/v1/text-to-speech/{voice}/stream"): streamed_speech(wanted),
        ("POST", "/v1/text-to-speech/{voice}/with-timestamps"): speech_with_timestamps,
        ("POST", "/v1/text-to-speech/{voice}/stream/with-timestamps"): streamed_speech_with_timestamps,
        ("GET", "/{version:v1|v2}/voices"): voices,
        ("GET", "/v1/models"): models,
    }
    async with run_stand_in(routes) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    key = await connect_template(ctx, project, stand_in, template="elevenlabs-text-to-speech")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="elevenlabs", template_id="elevenlabs-voices", actor="tests"
    )
    return key


@pytest.fixture
async def client(gateway_url: str, project: Project, key: str) -> AsyncIterator[AsyncElevenLabs]:
    async with httpx.AsyncClient(timeout=10) as http:  # the SDK never closes the one it makes itself
        yield AsyncElevenLabs(api_key=project.token, base_url=f"{gateway_url}/proxy/elevenlabs", httpx_client=http)


def assert_key_placed(stand_in: StandIn, project: Project, key: str) -> None:
    for received in stand_in.received:
        assert [value for name, value in received.headers if name.lower() == "xi-api-key"] == [key]
        assert "authorization" not in received.header_names()
    assert_token_nowhere(stand_in, project)


async def test_speech_is_converted_whole(
    client: AsyncElevenLabs, stand_in: StandIn, project: Project, key: str
) -> None:
    audio = client.text_to_speech.convert(
        VOICE, text="hi", model_id=MODEL, output_format="mp3_44100_128", request_options=NO_RETRY
    )
    assert b"".join([chunk async for chunk in audio]) == b"".join(AUDIO)
    assert stand_in.last.path_qs == f"/v1/text-to-speech/{VOICE}?output_format=mp3_44100_128"
    assert json.loads(stand_in.last.body) == {"text": "hi", "model_id": MODEL}
    assert_key_placed(stand_in, project, key)


async def test_streamed_speech_arrives_chunk_by_chunk(
    client: AsyncElevenLabs, stand_in: StandIn, project: Project, key: str, wanted: asyncio.Event
) -> None:
    received = []
    async for chunk in client.text_to_speech.stream(VOICE, text="hi", model_id=MODEL, request_options=NO_RETRY):
        received.append(chunk)
        wanted.set()
    assert received == AUDIO
    assert stand_in.last.path_qs == f"/v1/text-to-speech/{VOICE}/stream"
    assert_key_placed(stand_in, project, key)


async def test_speech_with_timestamps_whole_and_streamed(
    client: AsyncElevenLabs, stand_in: StandIn, project: Project, key: str
) -> None:
    whole = await client.text_to_speech.convert_with_timestamps(VOICE, text="hi", request_options=NO_RETRY)
    assert whole.alignment is not None
    assert whole.alignment.characters == ["h", "i"]
    streamed = client.text_to_speech.stream_with_timestamps(VOICE, text="hi", request_options=NO_RETRY)
    assert [chunk.audio_base_64 async for chunk in streamed] == [base64.b64encode(a).decode() for a in AUDIO[:2]]
    assert stand_in.last.path_qs == f"/v1/text-to-speech/{VOICE}/stream/with-timestamps"
    assert_key_placed(stand_in, project, key)


async def test_voices_are_searched_on_v2_and_listed_on_v1_and_models_listed(
    client: AsyncElevenLabs, stand_in: StandIn, project: Project, key: str
) -> None:
    searched = await client.voices.search(request_options=NO_RETRY)
    listed = await client.voices.get_all(request_options=NO_RETRY)
    assert [voice.voice_id for voice in searched.voices] == [voice.voice_id for voice in listed.voices] == [VOICE]
    assert [model.model_id for model in await client.models.list(request_options=NO_RETRY)] == [MODEL]
    assert [received.path_qs for received in stand_in.received] == ["/v2/voices", "/v1/voices", "/v1/models"]
    assert_key_placed(stand_in, project, key)
