"""Verify on save: setting a key can ask the provider, through the template's cheap call, whether it accepts it."""

from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from credgate.services import admins, projects
from credgate.services.context import Context
from tests.secret_sweep import SWEEP
from tests.upstream import Upstream

KEY = "sk-test-verify-key-000000000000abcd"
SWEEP.register(KEY)


@pytest.fixture
async def api(gateway_url: str, ctx: Context) -> AsyncIterator[httpx.AsyncClient]:
    token = await admins.create_admin_token(ctx, name="verify", actor="t")
    async with httpx.AsyncClient(
        base_url=f"{gateway_url}/api/v1", headers={"Authorization": f"Bearer {token}"}
    ) as client:
        yield client


@pytest.fixture
async def refusing_upstream() -> AsyncIterator[str]:
    async def refuse(_request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "Incorrect API key provided"}}, status=401)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def new_project(ctx: Context) -> str:
    project, _ = await projects.create_project(ctx, name="verify", actor="t")
    return project.id


async def test_a_key_the_provider_accepts_is_reported_accepted(
    api: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    body = {
        "provider": "openai",
        "template": "openai-chat-completions",
        "api_key": KEY,
        "base_url": f"{upstream.url}/echo/openai",
        "verify": True,
    }
    response = await api.post(f"/projects/{await new_project(ctx)}/integrations", json=body)
    assert response.status_code == 201
    assert response.json()["verification"] == {
        "accepted": True,
        "status": 200,
        "message": "the provider accepted the key",
    }
    assert (upstream.last.method, upstream.last.path_qs) == ("GET", "/echo/openai/models")
    assert upstream.last.header("authorization") == f"Bearer {KEY}"


async def test_a_key_the_provider_refuses_is_reported_refused_and_still_saved(
    api: httpx.AsyncClient, ctx: Context, refusing_upstream: str
) -> None:
    project_id = await new_project(ctx)
    body = {"provider": "anthropic", "template": "anthropic-messages", "api_key": KEY, "base_url": refusing_upstream}
    assert (await api.post(f"/projects/{project_id}/integrations", json=body)).status_code == 201
    response = await api.put(
        f"/projects/{project_id}/integrations/anthropic/key", json={"api_key": KEY, "verify": True}
    )
    assert response.status_code == 200
    assert response.json()["verification"] == {
        "accepted": False,
        "status": 401,
        "message": "the provider refused the key",
    }
    assert response.json()["key"]["status"] == "active"


async def test_without_a_verification_call_nothing_is_claimed(
    api: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    body = {"provider": "custom", "base_url": upstream.url, "api_key": KEY, "verify": True}
    response = await api.post(f"/projects/{await new_project(ctx)}/integrations", json=body)
    assert response.json()["verification"] == {
        "accepted": None,
        "status": None,
        "message": "no verification call is known for this integration",
    }
    assert upstream.received == []


async def test_without_verify_the_answer_has_the_contract_shape(
    api: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    body = {"provider": "custom", "base_url": upstream.url, "api_key": KEY}
    response = await api.post(f"/projects/{await new_project(ctx)}/integrations", json=body)
    assert "verification" not in response.json()
