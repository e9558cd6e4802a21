"""Google Vertex AI through the gateway: google-genai (vertexai=True), anthropic's AnthropicVertex and the openai
SDK at the OpenAI-compatible endpoint, each given the project token as its access token. The gateway holds the
service account's JSON key file and trades a signed assertion for an access token at a token-endpoint stand-in
that verifies it with google-auth, as Google does; the Vertex stand-in answers only at the real paths, and only
to that access token."""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google import genai
from google.genai import errors as genai_errors
from google.genai.types import HttpOptions
from google.oauth2.credentials import Credentials
from openai import AsyncOpenAI

from credgate.services import integrations
from credgate.services.context import Context
from credgate.services.integrations import IntegrationChanges
from credgate.specs import GoogleServiceAccountAuth
from tests.e2e.conftest import Project
from tests.sdk.standin import Handler, StandIn, assert_token_nowhere, run_stand_in
from tests.secret_sweep import SWEEP
from tests.service_accounts import GoogleTokenEndpoint, ServiceAccount, new_service_account, run_google_token_endpoint

# The SDK goes through aiohttp when it is installed, and subclasses its ClientSession, which aiohttp warns about.
pytestmark = pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")
PROJECT, LOCATION = "credgate-tests", "us-central1"
GEMINI, CLAUDE = "gemini-2.5-flash", "claude-sonnet-4@20250514"
PREFIX = f"projects/{PROJECT}/locations/{LOCATION}"
TEMPLATES = ("vertex-generate-content", "vertex-anthropic-messages", "vertex-openai-chat-completions")


def generated(text: str) -> dict[str, object]:
    """A `GenerateContentResponse` as Vertex AI documents it."""
    return {
        "candidates": [{"content": {"parts": [{"text": text}], "role": "model"}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 3, "totalTokenCount": 5},
        "modelVersion": GEMINI,
    }


MESSAGE = {
    "id": "msg_vrtx_1",
    "type": "message",
    "role": "assistant",
    "model": CLAUDE,
    "content": [{"type": "text", "text": "Hello!"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 2},
}
CLAUDE_EVENTS: list[dict[str, Any]] = [
    {"type": "message_start", "message": MESSAGE | {"content": [], "stop_reason": None}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo!"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
    {"type": "message_stop"},
]


class Vertex:
    """The stand-in's Google Cloud project: every route first checks the bearer token the token endpoint issued."""

    def __init__(self, token_endpoint: GoogleTokenEndpoint) -> None:
        self.token_endpoint = token_endpoint
        self.refused: list[str] = []

    def routes(self) -> dict[tuple[str, str], Handler]:
        def authorized(handler: Handler) -> Handler:
            async def handle(request: web.Request, body: bytes) -> web.StreamResponse:
                credentials = request.headers.getall("Authorization", [])
                issued = {f"Bearer {token}" for token in self.token_endpoint.issued}
                if len(credentials) != 1 or credentials[0] not in issued:
                    self.refused.append(request.path)
                    error = {"code": 401, "message": "Request had invalid authentication credentials."}
                    return web.json_response({"error": error | {"status": "UNAUTHENTICATED"}}, status=401)
                if (request.match_info["project"], request.match_info["location"]) != (PROJECT, LOCATION):
                    raise web.HTTPNotFound()
                return await handler(request, body)

            return handle

        scope = "/projects/{project}/locations/{location}"
        google = f"/{{version:v1|v1beta1}}{scope}/publishers/google/models/{{model}}"
        claude = f"/v1{scope}/publishers/anthropic/models/{{model}}"
        return {
            ("POST", f"{google}:generateContent"): authorized(self.generate),
            ("POST", f"{google}:streamGenerateContent"): authorized(self.stream_generate),
            ("POST", f"{google}:countTokens"): authorized(self.count_tokens),
            ("POST", f"{claude}:rawPredict"): authorized(self.raw_predict),
            ("POST", f"{claude}:streamRawPredict"): authorized(self.stream_raw_predict),
            ("POST", f"/{{version:v1|v1beta1}}{scope}/endpoints/openapi/chat/completions"): authorized(self.chat),
        }

    async def generate(self, request: web.Request, body: bytes) -> web.StreamResponse:
        assert json.loads(body)["contents"][0]["parts"] == [{"text": "hi"}]
        return web.json_response(generated("Hello!"))

    async def stream_generate(self, request: web.Request, body: bytes) -> web.StreamResponse:
        if request.query.get("alt") != "sse":  # without it the API answers one JSON array, which the SDK does not read
            raise web.HTTPNotFound()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for text in ("Hel", "lo", "!"):
            await response.write(f"data: {json.dumps(generated(text))}\r\n\r\n".encode())
        await response.write_eof()
        return response

    async def count_tokens(self, request: web.Request, body: bytes) -> web.StreamResponse:
        return web.json_response({"totalTokens": 7, "totalBillableCharacters": 2})

    async def raw_predict(self, request: web.Request, body: bytes) -> web.StreamResponse:
        document = json.loads(body)
        assert document["anthropic_version"] == "vertex-2023-10-16"
        if request.match_info["model"] == "count-tokens":
            return web.json_response({"input_tokens": 9})
        assert "model" not in document  # Vertex takes the model from the path
        return web.json_response(MESSAGE)

    async def stream_raw_predict(self, request: web.Request, body: bytes) -> web.StreamResponse:
        assert json.loads(body)["stream"] is True
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in CLAUDE_EVENTS:
            await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        await response.write_eof()
        return response

    async def chat(self, request: web.Request, body: bytes) -> web.StreamResponse:
        model = json.loads(body)["model"]
        return web.json_response(
            {
                "id": "chatcmpl-vertex-1",
                "object": "chat.completion",
                "created": 1_700_000_000,
                "model": model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
            }
        )


@pytest.fixture(scope="module")
def account() -> ServiceAccount:
    return new_service_account(project_id=PROJECT)


@pytest.fixture
async def token_endpoint(account: ServiceAccount) -> AsyncIterator[GoogleTokenEndpoint]:
    async with run_google_token_endpoint(account) as running:
        yield running


@pytest.fixture
async def vertex(token_endpoint: GoogleTokenEndpoint) -> AsyncIterator[tuple[Vertex, StandIn]]:
    google_project = Vertex(token_endpoint)
    async with run_stand_in(google_project.routes()) as stand_in:
        yield google_project, stand_in


async def connect(ctx: Context, project: Project, stand_in: StandIn, token_url: str, key_file: str) -> None:
    """Vertex from every template, moved to the stand-in, its token endpoint to the token stand-in."""
    for template in TEMPLATES:
        await integrations.add_template_integration(
            ctx,
            project_id=project.id,
            provider="vertex",
            template_id=template,
            actor="tests",
            api_key=key_file if template == TEMPLATES[0] else None,
            base_url=stand_in.url,
        )
    auth = GoogleServiceAccountAuth(method="google_service_account", token_url=token_url)
    await integrations.update_integration(
        ctx, project_id=project.id, provider="vertex", changes=IntegrationChanges(auth=auth), actor="tests"
    )


@pytest.fixture
async def connected(
    ctx: Context, project: Project, vertex: tuple[Vertex, StandIn], token_endpoint: GoogleTokenEndpoint,
    account: ServiceAccount,
) -> None:  # fmt: skip
    await connect(ctx, project, vertex[1], token_endpoint.url, account.key_file)


def gemini(gateway_url: str, project: Project, api_version: str | None = None) -> genai.Client:
    """google-genai on Vertex AI as the README shows it; it retries nothing unless told to (timeout in ms)."""
    return genai.Client(
        vertexai=True,
        project=PROJECT,
        location=LOCATION,
        credentials=Credentials(token=project.token),  # type: ignore[no-untyped-call]
        http_options=HttpOptions(base_url=f"{gateway_url}/proxy/vertex", api_version=api_version, timeout=10_000),
    )


@pytest.fixture
async def claude(gateway_url: str, project: Project) -> AsyncIterator[anthropic.AsyncAnthropicVertex]:
    client = anthropic.AsyncAnthropicVertex(
        region=LOCATION,
        project_id=PROJECT,
        access_token=project.token,
        base_url=f"{gateway_url}/proxy/vertex/v1",
        max_retries=0,
        timeout=10,
    )
    async with client:
        yield client


@pytest.fixture(autouse=True)
def sdk_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDKs' own defaults, whatever the machine's environment chooses."""
    for name in (
        "GOOGLE_GENAI_API_VERSION", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_API_KEY", "GEMINI_API_KEY",
        "GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION", "GOOGLE_APPLICATION_CREDENTIALS",
        "CLOUD_ML_REGION", "ANTHROPIC_VERTEX_PROJECT_ID", "ANTHROPIC_VERTEX_BASE_URL",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def assert_placed_once(
    vertex: tuple[Vertex, StandIn], token_endpoint: GoogleTokenEndpoint, account: ServiceAccount, project: Project
) -> None:
    """Every call carried the one access token, once; the key file, its private key and the project token
    went nowhere upstream; and one token served every call."""
    google_project, stand_in = vertex
    assert google_project.refused == []
    assert stand_in.unrouted == []
    assert len(token_endpoint.issued) == 1
    for received in stand_in.received:
        assert [value for name, value in received.headers if name.lower() == "authorization"] == [
            f"Bearer {token_endpoint.issued[0]}"
        ]
        seen = repr(received.headers) + received.path_qs + received.body.decode("latin-1")
        assert not any(part in seen for part in (account.key_file, *account.private_key_pem.splitlines()[1:-1]))
    assert_token_nowhere(stand_in, project)


async def test_genai_generate_content_plain_and_streamed(
    gateway_url: str, project: Project, vertex: tuple[Vertex, StandIn], token_endpoint: GoogleTokenEndpoint,
    account: ServiceAccount, connected: None,
) -> None:  # fmt: skip
    client = gemini(gateway_url, project)
    response = await client.aio.models.generate_content(model=GEMINI, contents="hi")
    assert response.text == "Hello!"
    assert vertex[1].last.path_qs == f"/v1beta1/{PREFIX}/publishers/google/models/{GEMINI}:generateContent"

    stream = await client.aio.models.generate_content_stream(model=GEMINI, contents="hi")
    assert [chunk.text async for chunk in stream] == ["Hel", "lo", "!"]
    streamed = f"/v1beta1/{PREFIX}/publishers/google/models/{GEMINI}:streamGenerateContent?alt=sse"
    assert vertex[1].last.path_qs == streamed

    counted = await client.aio.models.count_tokens(model=GEMINI, contents="hi")
    assert counted.total_tokens == 7
    assert vertex[1].last.path_qs == f"/v1beta1/{PREFIX}/publishers/google/models/{GEMINI}:countTokens"

    on_v1 = await gemini(gateway_url, project, "v1").aio.models.generate_content(model=GEMINI, contents="hi")
    assert on_v1.text == "Hello!"
    assert vertex[1].last.path_qs == f"/v1/{PREFIX}/publishers/google/models/{GEMINI}:generateContent"
    assert len(vertex[1].received) == 4
    assert_placed_once(vertex, token_endpoint, account, project)


async def test_genai_in_sync_code(
    gateway_url: str, project: Project, vertex: tuple[Vertex, StandIn], token_endpoint: GoogleTokenEndpoint,
    account: ServiceAccount, connected: None,
) -> None:  # fmt: skip
    """The synchronous client, in a thread, as most applications call it."""

    def call() -> str | None:
        client = gemini(gateway_url, project)  # held: a client the garbage collector takes closes its connection
        return client.models.generate_content(model=GEMINI, contents="hi").text

    assert await asyncio.to_thread(call) == "Hello!"
    assert_placed_once(vertex, token_endpoint, account, project)


async def test_anthropic_vertex_messages_plain_and_streamed(
    claude: anthropic.AsyncAnthropicVertex, project: Project, vertex: tuple[Vertex, StandIn],
    token_endpoint: GoogleTokenEndpoint, account: ServiceAccount, connected: None,
) -> None:  # fmt: skip
    hi: list[Any] = [{"role": "user", "content": "hi"}]
    message = await claude.messages.create(model=CLAUDE, max_tokens=16, messages=hi)
    assert message.content[0].text == "Hello!"  # type: ignore[union-attr]
    assert vertex[1].last.path_qs == f"/v1/{PREFIX}/publishers/anthropic/models/{CLAUDE}:rawPredict"

    async with claude.messages.stream(model=CLAUDE, max_tokens=16, messages=hi) as stream:
        texts = [text async for text in stream.text_stream]
    assert texts == ["Hel", "lo!"]
    assert vertex[1].last.path_qs == f"/v1/{PREFIX}/publishers/anthropic/models/{CLAUDE}:streamRawPredict"

    counted = await claude.messages.count_tokens(model=CLAUDE, messages=hi)
    assert counted.input_tokens == 9
    assert vertex[1].last.path_qs == f"/v1/{PREFIX}/publishers/anthropic/models/count-tokens:rawPredict"
    assert_placed_once(vertex, token_endpoint, account, project)


async def test_the_openai_compatible_endpoint(
    gateway_url: str, project: Project, vertex: tuple[Vertex, StandIn], token_endpoint: GoogleTokenEndpoint,
    account: ServiceAccount, connected: None,
) -> None:  # fmt: skip
    base_url = f"{gateway_url}/proxy/vertex/v1/{PREFIX}/endpoints/openapi"
    async with AsyncOpenAI(base_url=base_url, api_key=project.token, max_retries=0, timeout=10) as client:
        completion = await client.chat.completions.create(
            model=f"google/{GEMINI}", messages=[{"role": "user", "content": "hi"}]
        )
    assert completion.choices[0].message.content == "Hello!"
    assert vertex[1].last.path_qs == f"/v1/{PREFIX}/endpoints/openapi/chat/completions"
    assert_placed_once(vertex, token_endpoint, account, project)


async def test_one_access_token_serves_every_sdk(
    gateway_url: str, project: Project, claude: anthropic.AsyncAnthropicVertex, vertex: tuple[Vertex, StandIn],
    token_endpoint: GoogleTokenEndpoint, account: ServiceAccount, connected: None,
) -> None:  # fmt: skip
    client = gemini(gateway_url, project)
    for _ in range(3):
        assert (await client.aio.models.generate_content(model=GEMINI, contents="hi")).text == "Hello!"
        message = await claude.messages.create(
            model=CLAUDE, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
        assert message.content[0].text == "Hello!"  # type: ignore[union-attr]
    assert len(vertex[1].received) == 6
    assert len(token_endpoint.bodies) == 1
    assert token_endpoint.grants[0]["iss"] == account.client_email
    assert_placed_once(vertex, token_endpoint, account, project)


async def test_a_key_google_does_not_accept_is_a_clear_502(
    ctx: Context, gateway_url: str, project: Project, claude: anthropic.AsyncAnthropicVertex,
    vertex: tuple[Vertex, StandIn], token_endpoint: GoogleTokenEndpoint, account: ServiceAccount,
) -> None:  # fmt: skip
    """The key file's private key is not the account's (a rotated key, another file): the signature fails."""
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    impostor = json.dumps(json.loads(account.key_file) | {"private_key": other.decode()}, indent=2)
    SWEEP.register(impostor)
    SWEEP.register(other.decode())
    await connect(ctx, project, vertex[1], token_endpoint.url, impostor)

    with pytest.raises(genai_errors.ServerError) as raised:
        await gemini(gateway_url, project).aio.models.generate_content(model=GEMINI, contents="hi")
    assert raised.value.code == 502
    assert "vertex: the token endpoint refused the credentials (status 400)" in str(raised.value)

    with pytest.raises(anthropic.APIStatusError) as refused:
        await claude.messages.create(model=CLAUDE, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 502
    assert "the token endpoint refused the credentials" in refused.value.message

    assert token_endpoint.issued == []
    assert token_endpoint.refused[0] == "Could not verify token signature."
    assert vertex[1].received == []
