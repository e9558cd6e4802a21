"""`CREDGATE_ADMIN_PORT`: the admin API, the panel and /metrics on a listener of their own, the main listener left
with the proxy and health. Run with two workers, which must both serve both sockets."""

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from credgate.config import Settings
from credgate.services import admins, projects
from credgate.services.bootstrap import open_context
from tests.e2e.conftest import Project, RunningGateway, add_custom, free_port, start_gateway, stop_gateway
from tests.secret_sweep import SWEEP
from tests.upstream import Upstream

# One pytest-xdist worker runs this module, so its module-scoped gateway starts once per run.
pytestmark = pytest.mark.xdist_group("admin_listener")
ADMIN_ONLY_PATHS = ["/api/v1/projects", "/api/v1/openapi.json", "/admin/login", "/admin", "/metrics"]


class Split:
    def __init__(self, gateway: RunningGateway, admin_url: str) -> None:
        self.gateway = gateway
        self.admin_url = admin_url

    @property
    def main_url(self) -> str:
        return self.gateway.url


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    folder = tmp_path_factory.mktemp("admin-listener")
    admin_port = free_port()
    process, gateway = start_gateway(
        folder / "data", folder / "gateway.log", {"CREDGATE_ADMIN_PORT": str(admin_port)}, workers=2
    )
    try:
        yield Split(gateway, f"http://127.0.0.1:{admin_port}")
    finally:
        stop_gateway(process, gateway)


async def add_project(data_dir: Path, upstream: Upstream) -> tuple[Project, str]:
    ctx = await open_context(Settings(data_dir=data_dir, allow_private_upstreams=True))
    try:
        created, token = await projects.create_project(ctx, name="split", actor="t")
        project = Project(created.id, token, "")
        await add_custom(ctx, project, "stand-in", upstream.url)
        return project, await admins.create_admin_token(ctx, name="split", actor="t")
    finally:
        await ctx.database.dispose()


async def test_the_main_listener_serves_the_proxy_and_health_and_nothing_of_the_admin(
    split: Split, upstream: Upstream
) -> None:
    project, admin_token = await add_project(split.gateway.log.parent / "data", upstream)
    admin = {"authorization": f"Bearer {admin_token}"}
    async with httpx.AsyncClient(base_url=split.main_url, timeout=10) as client:
        proxied = await client.get("/proxy/stand-in/echo/hi", headers={"authorization": f"Bearer {project.token}"})
        health = [(await client.get(path)).status_code for path in ("/healthz", "/readyz")]
        hidden = {path: await client.get(path, headers=admin) for path in ADMIN_ONLY_PATHS}
        written = await client.post("/api/v1/projects", json={"name": "through the front door"}, headers=admin)

    assert proxied.status_code == 200
    assert upstream.last.path_qs == "/echo/hi"
    assert health == [200, 200]
    assert {path: answer.status_code for path, answer in hidden.items()} == dict.fromkeys(ADMIN_ONLY_PATHS, 404)
    assert all(answer.json() == {"error": {"status": 404, "message": "not found"}} for answer in hidden.values())
    assert written.status_code == 404
    ctx = await open_context(Settings(data_dir=split.gateway.log.parent / "data"))
    try:
        assert [found.name for found in await projects.list_projects(ctx)] == ["split"]  # nothing was written
    finally:
        await ctx.database.dispose()


async def test_the_admin_listener_serves_the_api_the_panel_and_open_metrics_but_no_proxy(
    split: Split, upstream: Upstream
) -> None:
    project, admin_token = await add_project(split.gateway.log.parent / "data", upstream)
    async with httpx.AsyncClient(base_url=split.main_url, timeout=10) as main:
        for _ in range(2):
            answer = await main.get("/proxy/stand-in/echo/x", headers={"authorization": f"Bearer {project.token}"})
            assert answer.status_code == 200
    async with httpx.AsyncClient(base_url=split.admin_url, timeout=10) as client:
        listed = await client.get("/api/v1/projects", headers={"authorization": f"Bearer {admin_token}"})
        unauthenticated = await client.get("/api/v1/projects")
        panel = await client.get("/admin/login")
        scraped = await client.get("/metrics")  # no token: only the admin listener's network reaches it
        proxied = await client.get("/proxy/stand-in/echo/x", headers={"authorization": f"Bearer {project.token}"})
        # documented in the admin API's OpenAPI, but served beside the proxy: not here
        minting = await client.post(
            "/api/v1/client-tokens", json={}, headers={"authorization": f"Bearer {project.token}"}
        )
        health = await client.get("/healthz")

    assert listed.status_code == 200
    assert project.id in {found["id"] for found in listed.json()["items"]}
    assert unauthenticated.status_code == 401  # the API itself still wants its token
    assert panel.status_code == 200
    assert "<form" in panel.text
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    served = re.findall(
        rf'credgate_requests_total\{{project="{project.id}",provider="stand-in",status="200"\}} (\S+)', scraped.text
    )
    assert served == ["2.0"]  # summed over both workers
    assert proxied.status_code == 404
    assert minting.status_code == 404
    assert len([seen for seen in upstream.received if seen.path_qs == "/echo/x"]) == 2  # never forwarded from here
    assert health.status_code == 200
    SWEEP.capture("admin-listener metrics", scraped.text)
    assert project.token not in scraped.text
    assert admin_token not in scraped.text


def test_the_start_up_message_points_the_operator_at_the_admin_listener(split: Split) -> None:
    log = split.gateway.log.read_text()
    assert f"panel:     {split.admin_url}/admin" in log
    assert f"admin API: {split.admin_url}/api/v1" in log
    assert f"metrics:   {split.admin_url}/metrics" in log
    assert re.search(rf"{re.escape(split.admin_url)}/admin/setup\?token=\S+", log)
    assert f"proxy:     {split.main_url}/proxy/" in log
