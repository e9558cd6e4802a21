"""OpenTelemetry: `credgate serve` with only the standard OTEL_* variables exports a span per proxied request over
OTLP/HTTP, received here by a collector stand-in that decodes what arrives with OpenTelemetry's own protobufs."""

import asyncio
import gzip
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from credgate.config import Settings
from credgate.services.bootstrap import open_context
from tests.e2e.conftest import Project, RunningGateway, add_custom, add_project, free_port, start_gateway, stop_gateway
from tests.secret_sweep import SWEEP
from tests.upstream import Upstream

TRACE_ID = secrets.token_hex(16)
PARENT_SPAN_ID = secrets.token_hex(8)
QUERY_SECRET = "qs-" + secrets.token_urlsafe(16)


@dataclass
class Span:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    error: bool
    start_ns: int
    end_ns: int
    service: str


@dataclass
class Collector:
    url: str = ""
    spans: list[Span] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)  # every export as it arrived, for the secret sweep
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_for(self, count: int) -> list[Span]:
        async with asyncio.timeout(15):
            while len(self.spans) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.spans


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    assert kind is not None
    return getattr(value, kind)


def _decode(body: bytes) -> list[Span]:
    export = ExportTraceServiceRequest.FromString(body)
    found = []
    for resource_spans in export.resource_spans:
        resource = {item.key: _value(item.value) for item in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    Span(
                        name=span.name,
                        kind=span.kind,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes={item.key: _value(item.value) for item in span.attributes},
                        error=span.status.code == 2,  # STATUS_CODE_ERROR
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        service=resource["service.name"],
                    )
                )
    return found


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    state = Collector()

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        state.raw.append(body)
        state.spans.extend(_decode(body))
        state.arrived.set()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()


@pytest.fixture
def traced_gateway(tmp_path: Path, collector: Collector) -> Iterator[RunningGateway]:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    process, gateway = start_gateway(tmp_path / "data", tmp_path / "gateway.log", env)
    try:
        yield gateway
    finally:
        stop_gateway(process, gateway)


async def set_up(gateway: RunningGateway, upstream: Upstream) -> Project:
    ctx = await open_context(Settings(data_dir=gateway.log.parent / "data", allow_private_upstreams=True))
    try:
        project = await add_project(ctx, upstream)
        await add_custom(ctx, project, "down", f"http://127.0.0.1:{free_port()}")  # nothing listens there
        return project
    finally:
        await ctx.database.dispose()


async def test_a_streamed_call_is_a_server_span_under_the_callers_trace_with_its_upstream_call_and_tokens(
    traced_gateway: RunningGateway, upstream: Upstream, collector: Collector
) -> None:
    project = await set_up(traced_gateway, upstream)
    client = openai.AsyncOpenAI(api_key=project.token, base_url=f"{traced_gateway.url}/proxy/openai")
    stream = await client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"},
        extra_query={"key": QUERY_SECRET},
    )
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    await client.close()
    assert text == "Hello!"

    spans = await collector.wait_for(2)
    server = next(span for span in spans if span.kind == 2)  # SPAN_KIND_SERVER
    upstream_call = next(span for span in spans if span.kind == 3)  # SPAN_KIND_CLIENT
    assert (server.trace_id, server.parent_span_id) == (TRACE_ID, PARENT_SPAN_ID)
    assert (upstream_call.trace_id, upstream_call.parent_span_id) == (TRACE_ID, server.span_id)
    assert server.name == "chat openai"
    assert server.service == "credgate"
    assert server.attributes == {
        "http.request.method": "POST",
        "url.path": "/proxy/openai/chat/completions",
        "gen_ai.provider.name": "openai",
        "gen_ai.operation.name": "chat",
        "credgate.project.id": project.id,
        "credgate.request.id": server.attributes["credgate.request.id"],
        "http.response.status_code": 200,
        "gen_ai.usage.input_tokens": 5,
        "gen_ai.usage.output_tokens": 3,
    }
    assert upstream_call.attributes == {
        "http.request.method": "POST",
        "server.address": "127.0.0.1",
        "server.port": int(upstream.url.rsplit(":", 1)[1]),
        "http.response.status_code": 200,
    }
    assert not server.error
    assert not upstream_call.error
    # The stream's events came 50 ms apart: the span lasts as long as the response, not as long as the parsing.
    assert 0.1e9 <= server.end_ns - server.start_ns < 5e9
    assert server.start_ns <= upstream_call.start_ns <= upstream_call.end_ns <= server.end_ns
    assert_no_secret(collector, project)


async def test_refusals_and_an_unreachable_upstream_are_spans_too_and_carry_no_secret(
    traced_gateway: RunningGateway, upstream: Upstream, collector: Collector
) -> None:
    project = await set_up(traced_gateway, upstream)
    async with httpx.AsyncClient(base_url=traced_gateway.url, timeout=10) as client:
        wrong = await client.get("/proxy/openai/models", headers={"authorization": f"Bearer cgp_{QUERY_SECRET}"})
        down = await client.get(
            f"/proxy/down/anything?token={QUERY_SECRET}", headers={"authorization": f"Bearer {project.token}"}
        )
    assert (wrong.status_code, down.status_code) == (401, 502)

    spans = await collector.wait_for(3)
    refused = next(span for span in spans if span.attributes.get("http.response.status_code") == 401)
    failed = next(span for span in spans if span.attributes.get("http.response.status_code") == 502)
    unreached = next(span for span in spans if span.kind == 3)
    assert refused.name == "GET /proxy"  # no project, no provider: nothing the client made up is a name
    assert "credgate.project.id" not in refused.attributes
    assert not refused.error  # a client's mistake is not the server's error
    assert failed.name == "GET down"
    assert failed.error
    assert failed.attributes["error.type"] == "502"
    assert (unreached.parent_span_id, unreached.attributes["error.type"]) == (failed.span_id, "unreachable")
    assert unreached.error
    assert_no_secret(collector, project)


# What `opentelemetry-instrument` does at a process's start: a process-wide tracer provider, here exporting each span
# as it ends, to the collector the gateway's own tracing uses.
PROCESS_WIDE_TRACER = """
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)
print("a process-wide tracer provider is set", flush=True)
"""


async def test_the_admin_plane_sends_no_span_even_under_a_process_wide_tracer(
    tmp_path: Path, collector: Collector
) -> None:
    # FastAPI traces every request of its own once such a provider exists: the setup link's token would be exported.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(PROCESS_WIDE_TRACER)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "50", "PYTHONPATH": str(site)}
    process, gateway = start_gateway(tmp_path / "data", tmp_path / "gateway.log", env)
    try:
        found = re.search(r"http://\S+/admin/setup\?token=(\S+)", gateway.log.read_text())
        assert found is not None
        setup_link, setup_token = found.group(0), found.group(1)
        async with httpx.AsyncClient(timeout=10) as client:
            page = await client.get(setup_link)
            api = await client.get(f"{gateway.url}/api/v1/projects", headers={"authorization": "Bearer cga_wrong"})
            proxied = await client.get(f"{gateway.url}/proxy/openai/models")
        assert (page.status_code, api.status_code, proxied.status_code) == (200, 401, 401)
        spans = await collector.wait_for(1)  # the proxy's, after the others: those would have gone out as they ended
    finally:
        stop_gateway(process, gateway)
    assert "a process-wide tracer provider is set" in gateway.log.read_text()  # the sitecustomize ran
    assert [span.attributes["url.path"] for span in spans] == ["/proxy/openai/models"]
    exported = b"".join(collector.raw)
    SWEEP.capture("otlp export", exported.decode("latin-1"))
    assert setup_token.encode() not in exported


def assert_no_secret(collector: Collector, project: Project) -> None:
    exported = b"".join(collector.raw)
    SWEEP.capture("otlp export", exported.decode("latin-1"))
    for secret in (project.token, project.key, QUERY_SECRET):
        assert secret.encode() not in exported
