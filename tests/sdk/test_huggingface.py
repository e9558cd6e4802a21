"""huggingface_hub's `AsyncInferenceClient` through the gateway to the Inference Providers router: chat plain and
streamed at the router's `v1/chat/completions` (the client adds `/chat/completions` after a base URL ending in
`/v1`, `/v1/chat/completions` after any other), and an HF Inference task by model URL. The `openai` SDK at the
router's `/v1`: test_openai_compatible."""

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from huggingface_hub import AsyncInferenceClient

from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.openai_shapes import ANSWER, STREAMED, assert_bearer_key, chat
from tests.sdk.standin import StandIn, connect_template, run_stand_in

MODEL = "openai/gpt-oss-120b"
MESSAGES = [{"role": "user", "content": "hi"}]
SIMILARITY_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
SIMILARITY_PATH = f"/hf-inference/models/{SIMILARITY_MODEL}/pipeline/sentence-similarity"
SCORES = [0.75, 0.125]


async def sentence_similarity(request: web.Request, body: bytes) -> web.StreamResponse:
    """One score per sentence, as the HF Inference API answers the sentence-similarity pipeline."""
    return web.json_response(SCORES)


ROUTES = {
    ("POST", "/v1/chat/completions"): chat,
    ("POST", "/hf-inference/models/{org}/{name}/pipeline/sentence-similarity"): sentence_similarity,
}


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in(ROUTES) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    key = await connect_template(ctx, project, stand_in, template="huggingface-chat-completions")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="huggingface", template_id="huggingface-hf-inference", actor="tests"
    )
    return key


# The README's spelling (the router's documented https://router.huggingface.co/v1), and the host root.
@pytest.fixture(params=["/proxy/huggingface/v1", "/proxy/huggingface"])
async def client(
    request: pytest.FixtureRequest, gateway_url: str, project: Project
) -> AsyncIterator[AsyncInferenceClient]:
    async with AsyncInferenceClient(base_url=gateway_url + request.param, api_key=project.token, timeout=10) as client:
        yield client


def assert_reached(stand_in: StandIn, path: str) -> None:
    assert [received.path_qs for received in stand_in.received] == [path]
    assert stand_in.unrouted == []


async def test_chat_completion(client: AsyncInferenceClient, stand_in: StandIn, project: Project, key: str) -> None:
    answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert answer.choices[0].message.content == ANSWER
    assert json.loads(stand_in.last.body)["model"] == MODEL
    assert_reached(stand_in, "/v1/chat/completions")
    assert_bearer_key(stand_in, project, key)


async def test_streamed_chat_completion_arrives_chunk_by_chunk(
    client: AsyncInferenceClient, stand_in: StandIn, project: Project, key: str
) -> None:
    stream = await client.chat_completion(MESSAGES, model=MODEL, stream=True)
    assert [chunk.choices[0].delta.content async for chunk in stream] == list(STREAMED)
    assert json.loads(stand_in.last.body)["stream"] is True
    assert_reached(stand_in, "/v1/chat/completions")
    assert_bearer_key(stand_in, project, key)


async def test_hf_inference_task_by_model_url(
    client: AsyncInferenceClient, stand_in: StandIn, project: Project, key: str, gateway_url: str
) -> None:
    scores = await client.sentence_similarity(
        "a lighthouse",
        ["a tower by the sea", "a bowl of soup"],
        model=f"{gateway_url}/proxy/huggingface{SIMILARITY_PATH}",
    )
    assert scores == SCORES
    assert json.loads(stand_in.last.body)["inputs"] == {
        "source_sentence": "a lighthouse",
        "sentences": ["a tower by the sea", "a bowl of soup"],
    }
    assert_reached(stand_in, SIMILARITY_PATH)
    assert_bearer_key(stand_in, project, key)
