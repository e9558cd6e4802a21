"""The official `perplexityai` SDK (`perplexity`) through the gateway: a bearer key, chat completions plain and
streamed."""

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from perplexity import AsyncPerplexity

from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.standin import StandIn, assert_token_nowhere, connect_template, run_stand_in

MODEL = "sonar"
CITATIONS = ["https://example.org/hello"]
USAGE = {
    "prompt_tokens": 2,
    "completion_tokens": 3,
    "total_tokens": 5,
    "search_context_size": "low",
    "cost": {"input_tokens_cost": 0.0, "output_tokens_cost": 0.0, "request_cost": 0.005, "total_cost": 0.005},
}


def completion(so_far: str, delta: str, *, done: bool) -> dict[str, object]:
    """A chat completion as the API documents it: `message` holds the text so far, `delta` what a chunk adds."""
    return {
        "id": "3c6f8a0e-0000-4000-8000-000000000000",
        "model": MODEL,
        "created": 1_700_000_000,
        "object": "chat.completion" if done else "chat.completion.chunk",
        "citations": CITATIONS,
        "search_results": [{"title": "Hello", "url": CITATIONS[0], "date": None}],
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop" if done else None,
                "message": {"role": "assistant", "content": so_far},
                "delta": {"role": "assistant", "content": delta},
            }
        ],
        **({"usage": USAGE} if done else {}),
    }


async def chat(request: web.Request, body: bytes) -> web.StreamResponse:
    if not json.loads(body).get("stream"):
        return web.json_response(completion("Hello!", "", done=True))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    so_far = ""
    for index, text in enumerate(("Hel", "lo", "!")):
        so_far += text
        await response.write(f"data: {json.dumps(completion(so_far, text, done=index == 2))}\r\n\r\n".encode())
    await response.write_eof()
    return response


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in({("POST", "/chat/completions"): chat}) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    return await connect_template(ctx, project, stand_in, template="perplexity-chat-completions")


@pytest.fixture
async def client(gateway_url: str, project: Project, key: str) -> AsyncIterator[AsyncPerplexity]:
    base_url = f"{gateway_url}/proxy/perplexity"
    async with AsyncPerplexity(api_key=project.token, base_url=base_url, max_retries=0, timeout=10) as client:
        yield client


def assert_key_placed(stand_in: StandIn, project: Project, key: str) -> None:
    assert [value for name, value in stand_in.last.headers if name.lower() == "authorization"] == [f"Bearer {key}"]
    assert stand_in.last.path_qs == "/chat/completions"
    assert_token_nowhere(stand_in, project)


async def test_chat_completion_with_its_citations(
    client: AsyncPerplexity, stand_in: StandIn, project: Project, key: str
) -> None:
    answer = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "Hello!"
    assert answer.citations == CITATIONS
    assert answer.usage is not None
    assert answer.usage.total_tokens == 5
    assert_key_placed(stand_in, project, key)


async def test_streamed_chat_completion_arrives_chunk_by_chunk(
    client: AsyncPerplexity, stand_in: StandIn, project: Project, key: str
) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert [chunk.choices[0].delta.content async for chunk in stream] == ["Hel", "lo", "!"]
    assert json.loads(stand_in.last.body)["stream"] is True
    assert_key_placed(stand_in, project, key)
