"""Real-socket fixtures: `credgate serve` as a subprocess on a free port, its output kept for the sweep."""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.secret_sweep import SWEEP

CREDGATE = str(Path(sys.executable).with_name("credgate"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class RunningGateway:
    url: str
    env: dict[str, str]
    log: Path

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a `credgate` command against the same data dir and database as the server."""
        result = subprocess.run(
            [CREDGATE, *args], input=stdin, capture_output=True, text=True, env=self.env, timeout=60, check=False
        )
        SWEEP.capture(f"cli {args[:2]}", result.stdout + result.stderr)
        return result


def start_gateway(
    data_dir: Path, log: Path, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], RunningGateway]:
    port = free_port()
    env = {**os.environ, "CREDGATE_DATA_DIR": str(data_dir), "CREDGATE_LOG_LEVEL": "debug", **(extra_env or {})}
    env = {name: value for name, value in env.items() if not name.startswith("CREDGATE_TEST_")}
    with log.open("wb") as output:
        process = subprocess.Popen(
            [CREDGATE, "serve", "--port", str(port)], stdout=output, stderr=subprocess.STDOUT, env=env
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"credgate serve exited with {process.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return process, RunningGateway(url=url, env=env, log=log)
        except httpx.TransportError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"credgate serve did not answer in time: {log.read_text()}")


def stop_gateway(process: subprocess.Popen[bytes], gateway: RunningGateway) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    SWEEP.capture("gateway log", gateway.log.read_text(errors="replace"))


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[RunningGateway]:
    """A real `credgate serve` on SQLite in a fresh data dir, logging at DEBUG."""
    process, running = start_gateway(tmp_path / "data", tmp_path / "gateway.log")
    try:
        yield running
    finally:
        stop_gateway(process, running)
        for name in ("credgate.db", "credgate.db-wal"):
            SWEEP.scan_file(tmp_path / "data" / name, SWEEP.secrets)
