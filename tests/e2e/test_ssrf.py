"""The SSRF guard through the product: refused when configured (422) and when connecting (502)."""

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from credgate.app import create_app
from credgate.config import Settings
from credgate.errors import InvalidInput
from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project, add_custom, serving, start_gateway, stop_gateway
from tests.upstream import Upstream


@pytest.fixture
async def guarded_url(settings: Settings, ctx: Context) -> AsyncIterator[str]:
    """The gateway with the guard on (CREDGATE_ALLOW_PRIVATE_UPSTREAMS unset)."""
    async with serving(create_app(settings.model_copy(update={"allow_private_upstreams": False}), context=ctx)) as url:
        yield url


@pytest.mark.parametrize("base_url", ["https://localhost/v1", "https://0x7f000001/v1", "http://8.8.8.8/v1"])
async def test_a_private_or_plain_http_base_url_is_refused_when_configured(
    ctx: Context, project: Project, base_url: str
) -> None:
    ctx.allow_private_upstreams = False
    with pytest.raises(InvalidInput, match=r"base_url: (reaches a loopback|must use https)"):
        await integrations.add_custom_integration(
            ctx, project_id=project.id, provider="inside", base_url=base_url, api_key="sk-test-ssrf-000000", actor="t"
        )


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("localhost", "address is not public"),
        ("localhost.", "address is not public"),
        ("2130706433", "address is not public"),
    ],
)
async def test_a_private_upstream_configured_earlier_is_refused_when_connecting(
    guarded_url: str, ctx: Context, project: Project, upstream: Upstream, host: str, reason: str
) -> None:
    port = upstream.url.rsplit(":", 1)[1]
    await add_custom(ctx, project, "inside", f"http://{host}:{port}")  # allowed when it was configured
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{guarded_url}/proxy/inside/echo/x", json={}, headers={"Authorization": f"Bearer {project.token}"}
        )
    assert (response.status_code, response.headers["x-credgate-error"]) == (502, "true")
    assert reason in response.json()["error"]["message"]
    assert upstream.received == []


@pytest.mark.parametrize("allow", [True, False])
def test_serve_says_loudly_when_the_guard_is_off(tmp_path: Path, allow: bool) -> None:
    env = {"CREDGATE_ALLOW_PRIVATE_UPSTREAMS": str(allow).lower()}
    process, running = start_gateway(tmp_path / "data", tmp_path / "gateway.log", env)
    stop_gateway(process, running)
    output = running.log.read_text()
    assert ("WARNING: CREDGATE_ALLOW_PRIVATE_UPSTREAMS is on" in output) is allow
    assert ("WARNING credgate: CREDGATE_ALLOW_PRIVATE_UPSTREAMS is on" in output) is allow  # the log line too
