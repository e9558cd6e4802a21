"""Amazon Bedrock through the gateway: boto3's `bedrock-runtime` client and anthropic's `AnthropicBedrock`, each
given the project token as its access key id (or as its Bedrock API key), against a stand-in that verifies the
gateway's SigV4 signature with botocore, as AWS would, and answers only at the runtime API's real paths."""

import asyncio
import base64
import binascii
import hmac
import json
import secrets
import struct
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import anthropic
import boto3
import httpx
import pytest
from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from credgate.errors import BadGateway
from credgate.proxy.plan import UpstreamRequest
from credgate.proxy.sigv4 import region_of, sign
from credgate.services import integrations
from credgate.services.context import Context
from credgate.services.integrations import IntegrationChanges
from credgate.specs import AwsSigV4Auth
from tests.e2e.conftest import Project
from tests.sdk.standin import Handler, StandIn, assert_token_nowhere, run_stand_in
from tests.secret_sweep import SWEEP

MODEL = "anthropic.claude-3-5-sonnet-20240620-v1:0"
REGION = "eu-west-3"
EVENTSTREAM = "application/vnd.amazon.eventstream"


class AwsKey:
    """An access key of the stand-in's account; the secret and the session token are registered with the sweep."""

    def __init__(self, *, temporary: bool = False) -> None:
        self.key_id = "AKIA" + secrets.token_hex(8).upper()
        self.secret = secrets.token_urlsafe(30)
        self.session_token = secrets.token_urlsafe(60) if temporary else None
        SWEEP.register(self.secret)
        if self.session_token:
            SWEEP.register(self.session_token)

    @property
    def stored(self) -> str:
        return ":".join(part for part in (self.key_id, self.secret, self.session_token) if part)


def signature_problem(request: web.Request, body: bytes, key: AwsKey, *, url: str) -> str | None:
    """Why AWS would refuse this request's signature, or None: botocore recomputes it from the bytes received."""
    authorization = request.headers.get("Authorization", "")
    scheme, _, fields = authorization.partition(" ")
    parts = dict(field.strip().split("=", 1) for field in fields.split(",") if "=" in field)
    if scheme != "AWS4-HMAC-SHA256" or set(parts) != {"Credential", "SignedHeaders", "Signature"}:
        return "no SigV4 signature"
    key_id, date, region, service, terminal = parts["Credential"].split("/")
    if (key_id, region, service, terminal) != (key.key_id, REGION, "bedrock", "aws4_request"):
        return f"unexpected credential scope {region}/{service}"
    stamp = request.headers.get("X-Amz-Date", "")
    signed_at = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    if stamp[:8] != date or abs((datetime.now(UTC) - signed_at).total_seconds()) > 300:
        return "signature date out of range"
    if key.session_token is not None and request.headers.get("X-Amz-Security-Token") != key.session_token:
        return "session token missing"
    signed = parts["SignedHeaders"].split(";")
    if not {"host", "x-amz-date"} <= set(signed):
        return "host and date not signed"
    rebuilt = AWSRequest(method=request.method, url=url + request.raw_path, data=body)
    for name, value in request.raw_headers:
        if name.decode().lower() in signed:
            rebuilt.headers[name.decode()] = value.decode()
    rebuilt.context["timestamp"] = stamp
    signer = SigV4Auth(Credentials(key.key_id, key.secret, key.session_token), "bedrock", REGION)
    expected = signer.signature(signer.string_to_sign(rebuilt, signer.canonical_request(rebuilt)), rebuilt)
    return None if hmac.compare_digest(expected, parts["Signature"]) else "signature does not match"


def event_message(event_type: str, payload: dict[str, Any]) -> bytes:
    """One message of the AWS event stream encoding (a binary frame with CRC32 checksums)."""
    headers = b""
    for name, value in ((":event-type", event_type), (":content-type", "application/json"), (":message-type", "event")):
        headers += bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(value)) + value.encode()
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 16 + len(headers) + len(body), len(headers))
    message = prelude + struct.pack(">I", binascii.crc32(prelude)) + headers + body
    return message + struct.pack(">I", binascii.crc32(message))


MESSAGE = {
    "id": "msg_bdrk_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-3-5-sonnet-20240620",
    "content": [{"type": "text", "text": "Hello!"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 2},
}
ANTHROPIC_EVENTS = [
    {"type": "message_start", "message": MESSAGE | {"content": [], "stop_reason": None}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo!"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
    {"type": "message_stop"},
]
CONVERSE = {
    "output": {"message": {"role": "assistant", "content": [{"text": "Hello!"}]}},
    "stopReason": "end_turn",
    "usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5},
    "metrics": {"latencyMs": 12},
}
CONVERSE_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("messageStart", {"role": "assistant"}),
    ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hel"}}),
    ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "lo!"}}),
    ("contentBlockStop", {"contentBlockIndex": 0}),
    ("messageStop", {"stopReason": "end_turn"}),
    ("metadata", {"usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5}, "metrics": {"latencyMs": 12}}),
]


class Bedrock:
    """The stand-in's account: one access key, and the signature check every route makes first."""

    def __init__(self, key: AwsKey) -> None:
        self.key = key
        self.url = ""
        self.refused: list[str] = []

    def routes(self) -> dict[tuple[str, str], Handler]:
        def verified(handler: Handler) -> Handler:
            async def handle(request: web.Request, body: bytes) -> web.StreamResponse:
                problem = signature_problem(request, body, self.key, url=self.url)
                if problem is not None:
                    self.refused.append(problem)
                    error = {"message": f"The request signature we calculated does not match: {problem}"}
                    return web.json_response(
                        error, status=403, headers={"x-amzn-ErrorType": "InvalidSignatureException"}
                    )
                return await handler(request, body)

            return handle

        return {
            ("POST", "/model/{model}/converse"): verified(self.converse),
            ("POST", "/model/{model}/converse-stream"): verified(self.converse_stream),
            ("POST", "/model/{model}/invoke"): verified(self.invoke),
            ("POST", "/model/{model}/invoke-with-response-stream"): verified(self.invoke_stream),
        }

    async def converse(self, request: web.Request, body: bytes) -> web.StreamResponse:
        assert json.loads(body)["messages"][0]["content"] == [{"text": "hi"}]
        return web.json_response(CONVERSE, headers={"x-amzn-RequestId": "req-1"})

    async def converse_stream(self, request: web.Request, body: bytes) -> web.StreamResponse:
        return await self._events(request, CONVERSE_EVENTS)

    async def invoke(self, request: web.Request, body: bytes) -> web.StreamResponse:
        assert json.loads(body)["anthropic_version"] == "bedrock-2023-05-31"
        return web.json_response(MESSAGE)

    async def invoke_stream(self, request: web.Request, body: bytes) -> web.StreamResponse:
        chunks = [
            ("chunk", {"bytes": base64.b64encode(json.dumps(event).encode()).decode()}) for event in ANTHROPIC_EVENTS
        ]
        return await self._events(request, chunks)

    async def _events(self, request: web.Request, events: list[tuple[str, dict[str, Any]]]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": EVENTSTREAM, "x-amzn-RequestId": "req-2"})
        await response.prepare(request)
        for event_type, payload in events:
            await response.write(event_message(event_type, payload))
        await response.write_eof()
        return response


@pytest.fixture(params=[False, True], ids=["long-term key", "temporary credentials"])
def aws_key(request: pytest.FixtureRequest) -> AwsKey:
    return AwsKey(temporary=request.param)


@pytest.fixture
async def bedrock(aws_key: AwsKey) -> AsyncIterator[tuple[Bedrock, StandIn]]:
    account = Bedrock(aws_key)
    async with run_stand_in(account.routes()) as stand_in:
        account.url = stand_in.url
        yield account, stand_in


@pytest.fixture
async def connected(ctx: Context, project: Project, bedrock: tuple[Bedrock, StandIn]) -> Bedrock:
    """Bedrock from both templates, moved to the stand-in; the stand-in's host names no region, so it is set."""
    account, stand_in = bedrock
    for template, key in (("bedrock-converse", account.key.stored), ("bedrock-invoke", None)):
        await integrations.add_template_integration(
            ctx,
            project_id=project.id,
            provider="bedrock",
            template_id=template,
            actor="tests",
            api_key=key,
            base_url=stand_in.url,
        )
    await integrations.update_integration(
        ctx,
        project_id=project.id,
        provider="bedrock",
        changes=IntegrationChanges(auth=AwsSigV4Auth(method="aws_sigv4", region=REGION)),
        actor="tests",
    )
    return account


@pytest.fixture
def runtime(gateway_url: str, project: Project) -> Iterator[Any]:
    """boto3's bedrock-runtime client: the project token as its access key id, any secret, any region."""
    client = boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=f"{gateway_url}/proxy/bedrock",
        aws_access_key_id=project.token,
        aws_secret_access_key="not-used-by-credgate",
        config=Config(retries={"max_attempts": 1}, connect_timeout=5, read_timeout=10),
    )
    yield client
    client.close()


def assert_signed_upstream(stand_in: StandIn, account: Bedrock, project: Project) -> None:
    assert account.refused == []
    for received in stand_in.received:
        [authorization] = [value for name, value in received.headers if name.lower() == "authorization"]
        assert authorization.startswith(f"AWS4-HMAC-SHA256 Credential={account.key.key_id}/")
        assert account.key.secret not in repr(received.headers) + received.body.decode("latin-1")
        assert len([name for name, _ in received.headers if name.lower() == "x-amz-date"]) == 1
    assert_token_nowhere(stand_in, project)


async def test_converse_signed_by_the_gateway(
    runtime: Any, connected: Bedrock, bedrock: tuple[Bedrock, StandIn], project: Project
) -> None:
    _, stand_in = bedrock
    messages = [{"role": "user", "content": [{"text": "hi"}]}]
    answer = await asyncio.to_thread(runtime.converse, modelId=MODEL, messages=messages)
    assert answer["output"]["message"]["content"] == [{"text": "Hello!"}]
    assert stand_in.last.path_qs == "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
    assert_signed_upstream(stand_in, connected, project)


async def test_converse_stream_events_arrive_decoded(
    runtime: Any, connected: Bedrock, bedrock: tuple[Bedrock, StandIn], project: Project
) -> None:
    _, stand_in = bedrock

    def stream() -> list[str]:
        answer = runtime.converse_stream(modelId=MODEL, messages=[{"role": "user", "content": [{"text": "hi"}]}])
        return [
            event["contentBlockDelta"]["delta"]["text"] for event in answer["stream"] if "contentBlockDelta" in event
        ]

    assert await asyncio.to_thread(stream) == ["Hel", "lo!"]
    assert stand_in.last.path_qs.endswith("/converse-stream")
    assert_signed_upstream(stand_in, connected, project)


async def test_invoke_model_and_its_stream(
    runtime: Any, connected: Bedrock, bedrock: tuple[Bedrock, StandIn], project: Project
) -> None:
    _, stand_in = bedrock
    request = json.dumps(
        {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    )
    answer = await asyncio.to_thread(runtime.invoke_model, modelId=MODEL, body=request)
    assert json.loads(answer["body"].read())["content"][0]["text"] == "Hello!"

    def stream() -> list[str]:
        answer = runtime.invoke_model_with_response_stream(modelId=MODEL, body=request)
        events = [json.loads(event["chunk"]["bytes"]) for event in answer["body"]]
        return [event["delta"]["text"] for event in events if event["type"] == "content_block_delta"]

    assert await asyncio.to_thread(stream) == ["Hel", "lo!"]
    assert_signed_upstream(stand_in, connected, project)


@pytest.fixture
async def claude(gateway_url: str, project: Project) -> AsyncIterator[anthropic.AsyncAnthropicBedrock]:
    client = anthropic.AsyncAnthropicBedrock(
        aws_access_key=project.token,
        aws_secret_key="not-used-by-credgate",
        aws_region="us-east-1",
        base_url=f"{gateway_url}/proxy/bedrock",
        max_retries=0,
        timeout=10,
    )
    async with client:
        yield client


async def test_anthropic_bedrock_messages(
    claude: anthropic.AsyncAnthropicBedrock, connected: Bedrock, bedrock: tuple[Bedrock, StandIn], project: Project
) -> None:
    _, stand_in = bedrock
    message = await claude.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].text == "Hello!"  # type: ignore[union-attr]
    assert stand_in.last.path_qs == f"/model/{MODEL}/invoke"  # this SDK leaves the ':' as it is
    async with claude.messages.stream(
        model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        texts = [text async for text in stream.text_stream]
    assert texts == ["Hel", "lo!"]
    assert stand_in.last.path_qs.endswith("/invoke-with-response-stream")
    assert_signed_upstream(stand_in, connected, project)


async def test_a_body_sent_in_pieces_is_signed_whole(
    gateway_url: str, connected: Bedrock, bedrock: tuple[Bedrock, StandIn], project: Project
) -> None:
    """A chunked request body is read whole and signed over exactly the bytes forwarded. The token comes as a
    bearer token here, as boto3 sends a Bedrock API key (AWS_BEARER_TOKEN_BEDROCK; boto3 does so over https only)."""
    _, stand_in = bedrock
    document = json.dumps({"messages": [{"role": "user", "content": [{"text": "hi"}]}], "pad": "x" * 200_000})

    async def pieces() -> AsyncIterator[bytes]:
        encoded = document.encode()
        for start in range(0, len(encoded), 65_536):
            yield encoded[start : start + 65_536]

    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{gateway_url}/proxy/bedrock/model/{MODEL}/converse",
            content=pieces(),
            headers={"Authorization": f"Bearer {project.token}", "Content-Type": "application/json"},
        )
    assert response.status_code == 200, response.text
    assert stand_in.last.body == document.encode()
    assert_signed_upstream(stand_in, connected, project)


def test_the_region_comes_from_the_base_url_when_unset() -> None:
    plan = UpstreamRequest(
        method="POST", url="https://bedrock-runtime.ap-southeast-2.amazonaws.com/model/m/invoke", headers=[]
    )
    [authorization] = [
        value
        for name, value in sign(
            plan, b"{}", spec=AwsSigV4Auth(method="aws_sigv4"), key="AKIDEXAMPLE:s3cr3t", provider="bedrock"
        )
        if name == "Authorization"
    ]
    assert "/ap-southeast-2/bedrock/aws4_request" in authorization
    assert region_of("https://bedrock-runtime-fips.us-gov-west-1.amazonaws.com") == "us-gov-west-1"
    assert region_of("https://bedrock.example.com") is None
    elsewhere = UpstreamRequest(method="POST", url="https://bedrock.example.com/model/m/invoke", headers=[])
    with pytest.raises(BadGateway, match="no AWS region"):
        sign(elsewhere, b"", spec=AwsSigV4Auth(method="aws_sigv4"), key="A:B", provider="bedrock")


def test_a_malformed_stored_key_is_a_clear_502_naming_no_part_of_it() -> None:
    plan = UpstreamRequest(
        method="POST", url="https://bedrock-runtime.us-east-1.amazonaws.com/model/m/invoke", headers=[]
    )
    with pytest.raises(BadGateway) as refused:
        sign(plan, b"", spec=AwsSigV4Auth(method="aws_sigv4"), key="only-one-part-s3cr3t", provider="bedrock")
    assert "ACCESS_KEY_ID:SECRET_ACCESS_KEY" in refused.value.message
    assert "s3cr3t" not in refused.value.message


def test_the_clients_own_signature_headers_are_replaced() -> None:
    plan = UpstreamRequest(
        method="POST",
        url="https://bedrock-runtime.us-east-1.amazonaws.com/model/m/invoke",
        headers=[("X-Amz-Date", "19990101T000000Z"), ("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD"), ("Accept", "a")],
    )
    headers = sign(plan, b"{}", spec=AwsSigV4Auth(method="aws_sigv4"), key="AKIDEXAMPLE:s3cr3t", provider="bedrock")
    names = [name.lower() for name, _ in headers]
    assert names.count("x-amz-date") == 1
    assert dict(headers)["X-Amz-Date"] != "19990101T000000Z"
    assert "x-amz-content-sha256" not in names
    assert ("Accept", "a") in headers
