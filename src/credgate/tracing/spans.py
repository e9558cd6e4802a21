"""The spans of proxied requests, over the OpenTelemetry SDK (imported only when tracing is on)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Tracer

from credgate import __version__

# GenAI operation names (gen_ai.operation.name) of the endpoints whose path says what they do.
_OPERATIONS = (
    ("chat/completions", "chat"),
    ("messages", "chat"),
    ("responses", "chat"),
    ("embeddings", "embeddings"),
    ("completions", "text_completion"),
    (":generateContent", "generate_content"),
    (":streamGenerateContent", "generate_content"),
)


class Tracing:
    """This process's tracer, its exporter running in a background thread of the SDK's batch processor."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._tracer: Tracer = provider.get_tracer("credgate", __version__)

    @classmethod
    def open(cls) -> Tracing:
        """Tracing as the OTEL_* variables configure it, exporting over OTLP/HTTP."""
        resource = Resource.create()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: "credgate", "service.version": __version__}))
        # The sampler (OTEL_TRACES_SAMPLER), the exporter (endpoint, headers, timeout, compression) and the batch
        # processor (OTEL_BSP_*) read their own variables.
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return cls(provider)

    def start_request(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> RequestSpan:
        """The server span of a proxied request, under the client's trace context when it sends one."""
        carrier = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in headers}
        span = self._tracer.start_span(
            f"{method} /proxy",
            context=propagate.extract(carrier),
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        )
        return RequestSpan(self._tracer, span, method)

    def shutdown(self) -> None:
        """Export what is left, then stop the exporter (blocks for at most the exporter's timeout)."""
        self._provider.shutdown()


class RequestSpan:
    """One proxied request's spans: its own (server) and its upstream call's (client)."""

    def __init__(self, tracer: Tracer, span: Span, method: str) -> None:
        self._tracer = tracer
        self.span = span
        self._method = method
        self._upstream: Span | None = None
        self._end_ns: int | None = None
        self._tokens_known = False

    def identify(self, *, provider: str, project_id: str, request_id: str, endpoint: str) -> None:
        """What the request turned out to be once its token checked out; `provider` is one the project has."""
        operation = next((name for suffix, name in _OPERATIONS if endpoint.endswith(suffix)), None)
        self.span.update_name(f"{operation or self._method} {provider}")
        self.span.set_attributes(
            {"gen_ai.provider.name": provider, "credgate.project.id": project_id, "credgate.request.id": request_id}
        )
        if operation is not None:
            self.span.set_attribute("gen_ai.operation.name", operation)

    def start_upstream(self, method: str, host: str, port: int | None) -> None:
        """A span for a call upstream; one that a key pool passed over ends here."""
        if self._upstream is not None:
            self._upstream.end()
        attributes: dict[str, str | int] = {"http.request.method": method, "server.address": host}
        if port is not None:
            attributes["server.port"] = port
        self._upstream = self._tracer.start_span(
            method, context=trace.set_span_in_context(self.span), kind=trace.SpanKind.CLIENT, attributes=attributes
        )

    def upstream_answered(self, status: int) -> None:
        if self._upstream is not None:
            self._upstream.set_attribute("http.response.status_code", status)

    def upstream_failed(self, kind: str) -> None:
        """The upstream not reached, timed out, or cut its response off: `kind` is the error.type."""
        if self._upstream is not None:
            self._mark_error(self._upstream, kind)

    def tokens_counted(self, prompt: int | None, completion: int | None) -> None:
        """The usage the response reported, once the recorder has read it: the span may end."""
        if prompt is not None:
            self.span.set_attribute("gen_ai.usage.input_tokens", prompt)
        if completion is not None:
            self.span.set_attribute("gen_ai.usage.output_tokens", completion)
        self._tokens_known = True
        if self._end_ns is not None:
            self._end()

    def response_done(self, status: int, *, tokens_to_come: bool) -> None:
        """The response is over (5xx marks the server span an error). The spans end now, or, when the recorder
        is to read the response's tokens, once it has, with the time of now."""
        if status:
            self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self._mark_error(self.span, str(status))
        self._end_ns = time.time_ns()
        if not tokens_to_come or self._tokens_known:
            self._end()

    def _end(self) -> None:
        if self._upstream is not None:
            self._upstream.end(end_time=self._end_ns)
        self.span.end(end_time=self._end_ns)

    @staticmethod
    def _mark_error(span: Span, kind: str) -> None:
        span.set_attribute("error.type", kind)
        span.set_status(trace.Status(trace.StatusCode.ERROR))
