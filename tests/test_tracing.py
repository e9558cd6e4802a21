"""Which OTEL_* settings turn tracing on, and the clear refusals of those credgate cannot honour."""

import subprocess
import sys

import pytest
from click.testing import CliRunner

from credgate.cli import main
from credgate.errors import StartupError
from credgate.tracing import tracing_requested

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}


@pytest.mark.parametrize(
    ("environ", "requested"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "gateway"}, False),  # no endpoint: nothing to export to
        (ENDPOINT, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
        ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
        ({**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ],
)
def test_tracing_is_on_only_with_an_otlp_endpoint_and_nothing_turning_it_off(
    environ: dict[str, str], requested: bool
) -> None:
    assert tracing_requested(environ) is requested


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"])
def test_a_protocol_other_than_http_protobuf_is_refused_by_name(variable: str) -> None:
    with pytest.raises(StartupError, match="OTLP protocol grpc is not supported"):
        tracing_requested({**ENDPOINT, variable: "grpc"})


def test_serve_stops_at_once_on_an_unsupported_protocol(tmp_path: object) -> None:
    env = {**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "CREDGATE_DATA_DIR": str(tmp_path)}
    result = CliRunner().invoke(main, ["serve"], env=env)
    assert result.exit_code == 5
    assert "credgate exports traces over http/protobuf" in result.output


def test_without_otel_variables_the_sdk_is_never_loaded() -> None:
    script = (
        "import sys\n"
        "import credgate.cli, credgate.runtime, credgate.proxy\n"
        "from credgate.tracing import open_tracing\n"
        "assert open_tracing({}) is None\n"
        "loaded = [name for name in sys.modules if name.startswith('opentelemetry.sdk')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
