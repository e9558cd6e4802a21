"""Prometheus from Debian's package scrapes a real gateway's /metrics with an admin token, and the series are read
back through Prometheus's own HTTP API."""

import asyncio
import contextlib
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from credgate.services import admins
from credgate.services.context import Context
from tests.e2e.conftest import Project, free_port
from tests.secret_sweep import SWEEP

PROMETHEUS = Path("/usr/bin/prometheus")
HAVE_PROMETHEUS = PROMETHEUS.exists()
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


async def test_prometheus_scrapes_the_gateway_and_serves_its_series_back(
    gateway_url: str, ctx: Context, project: Project, tmp_path: Path
) -> None:
    if not HAVE_PROMETHEUS:
        pytest.skip("needs Debian's prometheus (apt-get install prometheus; CI installs it)")
    admin_token = await admins.create_admin_token(ctx, name="prometheus", actor="t")
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
        for _ in range(2):
            proxied = await client.post(
                "/proxy/openai/chat/completions", json=CHAT, headers={"authorization": f"Bearer {project.token}"}
            )
            assert proxied.status_code == 200
    port, log = free_port(), tmp_path / "prometheus.log"
    prometheus = start_prometheus(tmp_path, gateway_url.removeprefix("http://"), admin_token, port, log)
    query = f'credgate_requests_total{{project="{project.id}",provider="openai",status="200"}}'
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as api:
            deadline = time.monotonic() + 60
            while True:
                assert prometheus.poll() is None, log.read_text()
                answer: httpx.Response | None = None
                with contextlib.suppress(httpx.TransportError):
                    answer = await api.get("/api/v1/query", params={"query": query})
                result = answer.json()["data"]["result"] if answer and answer.status_code == 200 else []
                if result:
                    break
                assert time.monotonic() < deadline, f"no series scraped within 60 s: {log.read_text()}"
                await asyncio.sleep(0.5)
            up = (await api.get("/api/v1/query", params={"query": 'up{job="credgate"}'})).json()["data"]["result"]
            overhead = (
                await api.get("/api/v1/query", params={"query": "credgate_overhead_duration_seconds_count"})
            ).json()["data"]["result"]
    finally:
        prometheus.terminate()
        prometheus.wait(30)
        SWEEP.capture("prometheus log", log.read_text(errors="replace"))
    assert float(result[0]["value"][1]) == 2
    assert [float(sample["value"][1]) for sample in up] == [1.0]
    assert float(overhead[0]["value"][1]) >= 2
    assert admin_token not in log.read_text(errors="replace")


def start_prometheus(folder: Path, target: str, admin_token: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """Prometheus scraping `target` every second with the admin token (from a file: never on a command line)."""
    credentials = folder / "admin-token"
    credentials.write_text(admin_token)
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: credgate\n"
        f"    authorization: {{credentials_file: {credentials}}}\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    with log.open("wb") as output:
        return subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
