"""OpenTelemetry traces of proxied requests, configured only by the standard `OTEL_*` variables.

Off unless an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`): then
each proxied request is a server span (a child of the client's `traceparent` when it sends one) with the upstream
call as a client span under it, exported over OTLP/HTTP in the background. The SDK is an optional extra
(`credgate[otel]`), imported only when tracing is on.

Attributes follow OpenTelemetry's HTTP and GenAI semantic conventions where the value is known without reading a
body. No header value, query string or body ever goes into one: the path is recorded without its query, the
upstream by its host and port only.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from credgate.errors import StartupError

if TYPE_CHECKING:
    from credgate.tracing.spans import RequestSpan, Tracing

__all__ = ["RequestSpan", "Tracing", "open_tracing", "tracing_requested"]

_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def tracing_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the OTEL_* variables ask for traces: an OTLP endpoint, and neither the SDK nor its exporter off.
    StartupError when they ask for what cannot be: another protocol, or the SDK not installed."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    if not any(environ.get(name, "").strip() for name in _ENDPOINT_VARIABLES):
        return False
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol not in (None, "", "http/protobuf"):
        raise StartupError(f"OTLP protocol {protocol} is not supported: credgate exports traces over http/protobuf")
    if importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None:
        raise StartupError(
            "an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT) but OpenTelemetry is not installed: "
            "pip install 'credgate[otel]'"
        )
    return True


def open_tracing(environ: Mapping[str, str] = os.environ) -> Tracing | None:
    """This process's tracing when the OTEL_* variables ask for it (the SDK is imported only then), else None."""
    if not tracing_requested(environ):
        return None
    from credgate.tracing.spans import Tracing

    return Tracing.open()
