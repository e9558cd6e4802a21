"""The Gateway's own answers (health checks, /metrics, WebSockets) and what a worker loads: the admin API and FastAPI
only at the first request for them, never for the proxy, the health checks and the metrics."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Message, Scope

from credgate.app import Gateway, create_app
from credgate.config import Settings
from credgate.runtime import Runtime
from credgate.services import admins, projects
from credgate.services.bootstrap import open_context
from credgate.services.context import Context


@pytest.fixture
def backend() -> str:
    """Routing decided before any query: one database is enough."""
    return "sqlite"


async def test_health_checks_answer_get_and_head_and_refuse_other_methods_in_the_envelope(
    anonymous: httpx.AsyncClient,
) -> None:
    assert (await anonymous.get("/healthz")).json() == {"status": "ok"}
    assert (await anonymous.head("/healthz")).status_code == 200
    ready = await anonymous.get("/readyz")
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    refused = await anonymous.post("/readyz")
    assert refused.status_code == 405
    assert refused.json() == {"error": {"status": 405, "message": "method not allowed"}}
    assert refused.headers["x-credgate-error"] == "true"
    assert refused.headers["allow"] == "GET, HEAD"
    assert refused.headers["x-credgate-request-id"]


async def test_metrics_answer_get_only_and_only_with_an_admin_token(anonymous: httpx.AsyncClient) -> None:
    refused = await anonymous.get("/metrics")
    assert refused.status_code == 401
    assert refused.json() == {"error": {"status": 401, "message": "invalid admin token"}}
    assert refused.headers["www-authenticate"] == "Bearer"
    wrong = await anonymous.get("/metrics", headers={"authorization": "Bearer cga_not-a-token"})
    assert wrong.status_code == 401
    posted = await anonymous.post("/metrics")
    assert (posted.status_code, posted.headers["allow"]) == (405, "GET")
    assert posted.json() == {"error": {"status": 405, "message": "method not allowed"}}


async def test_a_websocket_is_refused(settings: Settings, ctx: Context) -> None:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "websocket.connect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "websocket", "path": "/admin/x", "raw_path": b"/admin/x", "headers": [], "server": None}
    await create_app(settings, context=ctx)(scope, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1000}]


async def test_gateways_in_one_process_share_the_control_app_but_each_serves_its_own_database(
    settings: Settings, ctx: Context, tmp_path: Path
) -> None:
    """The control app is built once per process (FastAPI readies each route at its first request); what it
    serves is the runtime of the gateway the request came through, never another's."""
    other_settings = Settings(data_dir=tmp_path / "other", allow_private_upstreams=True)
    other_ctx = await open_context(other_settings)
    try:
        mine, theirs = create_app(settings, context=ctx), create_app(other_settings, context=other_ctx)
        assert mine.control is theirs.control
        for gateway, context, name in ((mine, ctx, "mine"), (theirs, other_ctx, "theirs")):
            await projects.create_project(context, name=name, actor="t")
            token = await admins.create_admin_token(context, name="t", actor="t")
            transport = httpx.ASGITransport(app=gateway)
            headers = {"authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as client:
                listed = await client.get("/api/v1/projects")
                sign_in = await client.get("/admin/login")
            assert [project["name"] for project in listed.json()["items"]] == [name]
            assert sign_in.status_code == 200
    finally:
        await other_ctx.database.dispose()


async def test_a_control_app_that_cannot_be_built_answers_500_in_the_envelope_and_is_logged(
    settings: Settings, ctx: Context, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> Any:
        raise ImportError("a broken installation")

    gateway = Gateway(Runtime(settings, open_context, context=ctx), broken)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://credgate.test") as client:
        response = await client.get("/api/v1/projects")
        health = await client.get("/healthz")
    request_id = response.headers["x-credgate-request-id"]
    assert response.status_code == 500
    assert response.json() == {"error": {"status": 500, "message": f"internal error (request id {request_id})"}}
    assert response.headers["x-credgate-error"] == "true"
    assert health.status_code == 200  # the proxy and the health checks do without the control app
    assert f"unexpected failure of request {request_id}" in caplog.text


_WORKER = """
import asyncio, json, sys
import httpx
from credgate.app import create_app
from credgate.config import Settings
from credgate.services import admins

async def main() -> None:
    app = create_app(Settings(data_dir=sys.argv[1], database_url="sqlite+aiosqlite:///" + sys.argv[1] + "/db"))
    loaded = {}
    async with app.runtime.running():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://credgate.test") as client:
            statuses = [(await client.get("/healthz")).status_code, (await client.get("/readyz")).status_code]
            statuses.append((await client.post("/proxy/openai/chat/completions", json={})).status_code)
            token = await admins.create_admin_token(app.runtime.context, name="scraper", actor="t")
            scraped = await client.get("/metrics", headers={"authorization": f"Bearer {token}"})
            statuses.append(scraped.status_code)
            loaded["proxy"] = sorted({"fastapi", "credgate.admin_api.routes"} & set(sys.modules))
            statuses.append((await client.get("/api/v1/projects")).status_code)
            loaded["admin"] = sorted({"fastapi", "credgate.admin_api.routes"} & set(sys.modules))
    print(json.dumps({"statuses": statuses, "loaded": loaded}))

asyncio.run(main())
"""


def test_a_worker_serving_only_the_proxy_health_and_metrics_never_loads_fastapi_nor_the_admin_api(
    tmp_path: Path,
) -> None:
    """Prometheus scrapes every worker: /metrics is served without the control app (about 10 MB a worker)."""
    result = subprocess.run(
        [sys.executable, "-c", _WORKER, str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["statuses"] == [200, 200, 401, 200, 401]  # the last: the admin API, asked without a token
    assert report["loaded"] == {"proxy": [], "admin": ["credgate.admin_api.routes", "fastapi"]}
