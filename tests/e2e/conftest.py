"""Real-socket fixtures: `credgate serve` as a subprocess on a free port, its output kept for the sweep."""

import asyncio
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from credgate.app import Gateway, create_app
from credgate.config import Settings
from credgate.server import server_config
from credgate.services import integrations, projects
from credgate.services.context import Context
from credgate.services.integrations import IntegrationChanges
from credgate.specs import Endpoint
from tests.secret_sweep import SWEEP
from tests.upstream import Upstream, run_upstream

CREDGATE = str(Path(sys.executable).with_name("credgate"))
# CREDGATE_UPSTREAM_PORTS for a gateway with the SSRF guard on whose stand-ins listen where the system puts them.
EVERY_PORT = ",".join(str(port) for port in range(1, 65536))


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
    data_dir: Path, log: Path, extra_env: dict[str, str] | None = None, *, workers: int = 1
) -> tuple[subprocess.Popen[bytes], RunningGateway]:
    port = free_port()
    env = {
        **os.environ,
        "CREDGATE_DATA_DIR": str(data_dir),
        "CREDGATE_LOG_LEVEL": "debug",
        "CREDGATE_ALLOW_PRIVATE_UPSTREAMS": "true",  # the stand-in upstream is on loopback
        **(extra_env or {}),
    }
    env = {name: value for name, value in env.items() if not name.startswith("CREDGATE_TEST_")}
    with log.open("wb") as output:
        process = subprocess.Popen(
            [CREDGATE, "serve", "--port", str(port), "--workers", str(workers)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20 * workers  # each worker imports the whole gateway again
    with httpx.Client(timeout=1) as probe:  # one client: each new one loads the CA bundle, a tenth of a second
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"credgate serve exited with {process.returncode}: {log.read_text()}")
            try:
                if probe.get(f"{url}/healthz").status_code == 200:
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


# In-process fixtures: the gateway under uvicorn in the test's own event loop, on a real socket.


@pytest.fixture
def backend() -> str:
    """Real-socket tests run on SQLite; the storage and service tests cover PostgreSQL."""
    return "sqlite"


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    async with run_upstream() as running:
        yield running


class _Server(uvicorn.Server):
    """uvicorn's server, stopped at once: its main loop looks at `should_exit` every 0.1 s, and its shutdown gives
    open connections 0.1 s before it waits for them; about 150 ms a test, when no connection or request is left."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.stop = asyncio.Event()

    async def main_loop(self) -> None:
        await self.stop.wait()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.server_state.connections or self.server_state.tasks:
            await super().shutdown(sockets)
            return
        for server in self.servers:
            server.close()
        await self.lifespan.shutdown()


@asynccontextmanager
async def serving(app: Gateway, settings: Settings | None = None) -> AsyncIterator[str]:
    """An ASGI app under uvicorn, as `credgate serve` runs it, on a free port of this event loop."""
    port = free_port()
    server = _Server(server_config(app, settings or Settings(), port=port, lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop.set()
        await task


@pytest.fixture
async def gateway_url(settings: Settings, ctx: Context) -> AsyncIterator[str]:
    """The gateway's base URL, with DEBUG logging on, private (stand-in) upstreams allowed."""
    settings = settings.model_copy(update={"allow_private_upstreams": True})
    async with serving(create_app(settings, context=ctx), settings) as url:
        yield url


def bearer(token: str) -> dict[str, str]:
    """A request's Authorization header with `token`."""
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Project:
    id: str
    token: str
    key: str


async def add_project(ctx: Context, upstream: Upstream, *, key: str | None = None, provider: str = "openai") -> Project:
    """A project whose `provider` is the OpenAI chat and image templates pointed at the stand-in."""
    key = key or "sk-test-" + secrets.token_urlsafe(18)
    SWEEP.register(key)
    project, token = await projects.create_project(ctx, name="e2e", actor="tests")
    for template in ("openai-chat-completions", "openai-image-generations"):
        await integrations.add_template_integration(
            ctx,
            project_id=project.id,
            provider=provider,
            template_id=template,
            actor="tests",
            api_key=key if template == "openai-chat-completions" else None,
            base_url=f"{upstream.url}/v1",
        )
    return Project(id=project.id, token=token, key=key)


@pytest.fixture
async def project(ctx: Context, upstream: Upstream) -> Project:
    return await add_project(ctx, upstream)


async def add_custom(ctx: Context, project: Project, provider: str, base_url: str, **changes: Any) -> None:
    """A custom integration allowing every method and path (`* **`), with optional changes."""
    key = f"sk-{provider}-" + secrets.token_urlsafe(12)
    SWEEP.register(key)
    await integrations.add_custom_integration(
        ctx, project_id=project.id, provider=provider, base_url=base_url, api_key=key, actor="t"
    )
    everything = [Endpoint(method="*", path="**")]
    await integrations.set_endpoints(ctx, project_id=project.id, provider=provider, endpoints=everything, actor="t")
    if changes:
        await integrations.update_integration(
            ctx, project_id=project.id, provider=provider, changes=IntegrationChanges(**changes), actor="t"
        )
