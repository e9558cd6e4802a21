"""The `openai` SDK against each OpenAI-compatible provider of the catalogue: given the gateway's base URL that
stands for the one the provider documents for the openai SDK, it reaches the provider's real path."""

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import openai
import pytest

from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.openai_shapes import ANSWER, STREAMED, USAGE, assert_bearer_key, chat
from tests.sdk.standin import StandIn, connect_template, run_stand_in


@dataclass(frozen=True)
class Case:
    documented: str  # the base URL the provider documents for the openai SDK
    through_gateway: str  # the one to give it through the gateway (the README's table)
    template: str  # the chat template that allows the call


CASES = {
    "deepseek": Case("https://api.deepseek.com", "/proxy/deepseek", "deepseek-chat-completions"),
    "deepseek-v1": Case("https://api.deepseek.com/v1", "/proxy/deepseek/v1", "deepseek-chat-completions"),
    "xai": Case("https://api.x.ai/v1", "/proxy/xai", "xai-chat-completions"),
    "perplexity": Case("https://api.perplexity.ai", "/proxy/perplexity", "perplexity-chat-completions"),
    "openrouter": Case("https://openrouter.ai/api/v1", "/proxy/openrouter", "openrouter-chat-completions"),
    "groq": Case("https://api.groq.com/openai/v1", "/proxy/groq/openai/v1", "groq-chat-completions"),
    "together": Case("https://api.together.xyz/v1", "/proxy/together/v1", "together-chat-completions"),
    "mistral": Case("https://api.mistral.ai/v1", "/proxy/mistral/v1", "mistral-chat-completions"),
    "huggingface": Case("https://router.huggingface.co/v1", "/proxy/huggingface/v1", "huggingface-chat-completions"),
    "fireworks": Case("https://api.fireworks.ai/inference/v1", "/proxy/fireworks", "fireworks-chat-completions"),
    "cerebras": Case("https://api.cerebras.ai/v1", "/proxy/cerebras/v1", "cerebras-chat-completions"),
    "ollama": Case("https://ollama.com/v1", "/proxy/ollama/v1", "ollama-chat"),
    # Self-hosted, no public host: vLLM documents its own server's address, http://localhost:8000/v1.
    "vllm": Case("http://localhost:8000/v1", "/proxy/vllm/v1", "vllm-chat-completions"),
}
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture(params=CASES, ids=str)
def case(request: pytest.FixtureRequest) -> Case:
    return CASES[request.param]


@pytest.fixture
async def stand_in(case: Case) -> AsyncIterator[StandIn]:
    async with run_stand_in({("POST", f"{urlsplit(case.documented).path}/chat/completions"): chat}) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn, case: Case) -> str:
    template = ctx.templates[case.template]
    if not template.requires_base_url:  # the template's public host is the one the provider documents
        assert urlsplit(template.base_url).netloc == urlsplit(case.documented).netloc
    return await connect_template(ctx, project, stand_in, template=case.template)


@pytest.fixture
async def client(gateway_url: str, project: Project, case: Case) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=gateway_url + case.through_gateway, api_key=project.token, max_retries=0, timeout=10
    ) as client:
        yield client


def assert_reached(stand_in: StandIn, case: Case) -> None:
    assert [received.path_qs for received in stand_in.received] == [
        f"{urlsplit(case.documented).path}/chat/completions"
    ]
    assert stand_in.unrouted == []


async def test_chat_completion(
    client: openai.AsyncOpenAI, stand_in: StandIn, project: Project, key: str, case: Case
) -> None:
    answer = await client.chat.completions.create(model="some-model", messages=MESSAGES)
    assert answer.choices[0].message.content == ANSWER
    assert answer.usage is not None
    assert answer.usage.total_tokens == USAGE["total_tokens"]
    assert json.loads(stand_in.last.body)["messages"] == MESSAGES
    assert_reached(stand_in, case)
    assert_bearer_key(stand_in, project, key)


async def test_streamed_chat_completion_arrives_chunk_by_chunk(
    client: openai.AsyncOpenAI, stand_in: StandIn, project: Project, key: str, case: Case
) -> None:
    stream = await client.chat.completions.create(model="some-model", messages=MESSAGES, stream=True)
    assert [chunk.choices[0].delta.content async for chunk in stream] == list(STREAMED)
    assert_reached(stand_in, case)
    assert_bearer_key(stand_in, project, key)
