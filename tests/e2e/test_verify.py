"""Verify on save: setting a key can ask the provider, through the integration's cheap call (its admin's own, or its
template's), whether it accepts it."""

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
        "message": "no verification call is known for this integration: name one as its verify_call",
    }
    assert upstream.received == []


async def test_without_verify_the_answer_has_the_contract_shape(
    api: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    body = {"provider": "custom", "base_url": upstream.url, "api_key": KEY}
    response = await api.post(f"/projects/{await new_project(ctx)}/integrations", json=body)
    assert "verification" not in response.json()


async def test_a_custom_integration_checks_its_key_with_the_call_its_admin_names(
    api: httpx.AsyncClient, ctx: Context, upstream: Upstream
) -> None:
    """A custom integration has no template's call: its admin names one (`verify_call`), changes it with PATCH and
    removes it with null; the call goes under the base URL with the key, like any request, and no body."""
    project_id = await new_project(ctx)
    integration = f"/projects/{project_id}/integrations/handmade"
    body = {"provider": "handmade", "base_url": f"{upstream.url}/echo/handmade", "api_key": KEY, "verify": True}
    created = await api.post(
        f"/projects/{project_id}/integrations", json=body | {"verify_call": {"method": "GET", "path": "/v1/me/"}}
    )
    assert created.status_code == 201
    assert created.json()["verify_call"] == {"method": "GET", "path": "v1/me"}
    assert created.json()["verification"] == {
        "accepted": True,
        "status": 200,
        "message": "the provider accepted the key",
    }
    assert (upstream.last.method, upstream.last.path_qs) == ("GET", "/echo/handmade/v1/me")
    assert upstream.last.header("authorization") == f"Bearer {KEY}"

    changed = await api.patch(integration, json={"verify_call": {"method": "POST", "path": "auth/check"}})
    assert changed.json()["verify_call"] == {"method": "POST", "path": "auth/check"}
    checked = await api.put(f"{integration}/key", json={"api_key": KEY, "verify": True})
    assert checked.json()["verification"]["accepted"] is True
    assert (upstream.last.method, upstream.last.path_qs, upstream.last.body) == (
        "POST",
        "/echo/handmade/auth/check",
        b"",
    )

    kept = await api.patch(integration, json={"timeout_seconds": 30})
    assert kept.json()["verify_call"] == {"method": "POST", "path": "auth/check"}, "a PATCH without it keeps it"
    removed = await api.patch(integration, json={"verify_call": None})
    assert removed.json()["verify_call"] is None
    calls = len(upstream.received)
    unchecked = await api.put(f"{integration}/key", json={"api_key": KEY, "verify": True})
    assert unchecked.json()["verification"]["accepted"] is None
    assert len(upstream.received) == calls, "no call left to make"


@pytest.mark.parametrize(
    ("verify_call", "problem"),
    [
        ({"method": "DELETE", "path": "v1/me"}, "verify_call.method: Input should be 'GET' or 'POST'"),
        ({"method": "GET", "path": "v1/*"}, "verify_call.path: may hold no wildcard: it names one path"),
        ({"method": "GET", "path": "../admin"}, "verify_call.path: may not hold '.' or '..' segments"),
        ({"method": "GET", "path": "v1/%2e%2e/admin"}, "verify_call.path: is not a path the proxy would send (dot"),
        ({"method": "GET", "path": "v1/a%2fb"}, "verify_call.path: is not a path the proxy would send (empty"),
        ({"method": "GET"}, "verify_call.path: Field required"),
    ],
)
async def test_a_verification_call_that_is_not_one_call_under_the_base_url_is_refused(
    api: httpx.AsyncClient, ctx: Context, upstream: Upstream, verify_call: dict[str, str], problem: str
) -> None:
    project_id = await new_project(ctx)
    body = {"provider": "handmade", "base_url": upstream.url, "api_key": KEY, "verify_call": verify_call}
    refused = await api.post(f"/projects/{project_id}/integrations", json=body)
    assert refused.status_code == 422
    assert problem in refused.json()["error"]["message"]
    assert (await api.get(f"/projects/{project_id}/integrations/handmade")).status_code == 404, "nothing saved"
    assert upstream.received == []


async def test_a_template_setup_brings_its_own_call(api: httpx.AsyncClient, ctx: Context, upstream: Upstream) -> None:
    project_id = await new_project(ctx)
    base_url = f"{upstream.url}/echo/openai"
    body = {"provider": "openai", "template": "openai-chat-completions", "api_key": KEY, "base_url": base_url}
    refused = await api.post(
        f"/projects/{project_id}/integrations", json=body | {"verify_call": {"method": "GET", "path": "me"}}
    )
    assert refused.status_code == 422
    assert "verify_call" in refused.json()["error"]["message"]
    assert (await api.post(f"/projects/{project_id}/integrations", json=body)).json()["verify_call"] is None
    patched = await api.patch(
        f"/projects/{project_id}/integrations/openai", json={"verify_call": {"method": "GET", "path": "me"}}
    )
    assert patched.json()["verify_call"] == {"method": "GET", "path": "me"}, "its own replaces the template's"
    checked = await api.put(f"/projects/{project_id}/integrations/openai/key", json={"api_key": KEY, "verify": True})
    assert checked.json()["verification"]["accepted"] is True
    assert upstream.last.path_qs == "/echo/openai/me"
