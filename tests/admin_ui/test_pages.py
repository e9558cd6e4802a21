"""Panel pages in process: token rotation, integration settings, endpoints and field-level validation."""

import re
from datetime import timedelta

import httpx
import pytest

from credgate.services import integrations, projects
from credgate.services.access import resolve_access
from credgate.services.context import Context
from tests.admin_ui.test_security import csrf_of, signed_in_csrf


def shown_token(html: str) -> str | None:
    match = re.search(r'<output id="new-secret" class="token">([^<]+)</output>', html)
    return match.group(1) if match else None


async def test_rotating_the_token_shows_the_new_one_once_and_keeps_the_old_for_the_grace(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}"
    created_token = (await projects.rotate_project_token(ctx, project_id=project_id, actor="t"))[1]
    data = {"csrf": csrf, "grace_seconds": "60", "expires_in_days": "7"}
    response = await client.post(f"{page}/token/rotate", data=data, follow_redirects=True)
    new_token = shown_token(response.text)
    assert new_token is not None
    assert new_token.startswith("cgp_")
    assert shown_token((await client.get(page)).text) is None  # once only
    assert await resolve_access(ctx, token=created_token, provider="openai") is not None  # in its grace
    later = ctx.clock() + timedelta(seconds=61)
    ctx.clock = lambda: later
    assert await resolve_access(ctx, token=created_token, provider="openai") is None
    assert await resolve_access(ctx, token=new_token, provider="openai") is not None


async def test_settings_disable_the_integration_and_set_defaults(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    data = {
        "csrf": csrf,
        "base_url": "https://api.openai.com/v1",
        "timeout_seconds": "30",
        "stream_idle_timeout_seconds": "12.5",
        "total_timeout_seconds": "900",
        "headers": "OpenAI-Organization: org-1\n",
        "query": "api-version=2024-06-01\n",
    }
    response = await client.post(f"/admin/projects/{project_id}/integrations/openai", data=data)
    assert response.status_code == 303
    integration = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert (integration.enabled, integration.timeout_seconds) == (False, 30.0)
    assert (integration.stream_idle_timeout_seconds, integration.total_timeout_seconds) == (12.5, 900)
    assert (integration.headers, integration.query) == ({"OpenAI-Organization": "org-1"}, {"api-version": "2024-06-01"})


async def test_invalid_input_is_told_next_to_its_field_and_changes_nothing(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    data = {
        "csrf": csrf,
        "base_url": "ftp://nope",
        "timeout_seconds": "-1",
        "stream_idle_timeout_seconds": "300",
        "total_timeout_seconds": "3600",
        "enabled": "on",
        "headers": "",
        "query": "",
    }
    response = await client.post(f"/admin/projects/{project_id}/integrations/openai", data=data)
    assert response.status_code == 422
    assert re.search(
        r'id="base_url"[^>]*>\s*<p class="field-error" role="alert">The base URL must start with', response.text
    )
    assert "Must be a number above 0, at most 3600." in response.text
    integration = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert integration.base_url == "https://api.openai.com/v1"


async def test_endpoint_rows_are_added_and_removed(client: httpx.AsyncClient, ctx: Context, project_id: str) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}/integrations/openai/endpoints"
    data = {
        "csrf": csrf,
        "method": ["POST", "GET", "*"],
        "path": ["chat/completions", "models", "files/**"],
        "remove": ["0"],
    }
    assert (await client.post(page, data=data)).status_code == 303
    integration = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert integration.endpoints == [{"method": "GET", "path": "models"}, {"method": "*", "path": "files/**"}]
    bad = await client.post(page, data={"csrf": csrf, "method": ["GET"], "path": ["a/../b"]})
    assert bad.status_code == 422
    assert "may not hold &#39;.&#39; or &#39;..&#39; segments" in bad.text


async def test_a_wrong_key_is_refused_without_echoing_it(client: httpx.AsyncClient, project_id: str) -> None:
    csrf = await signed_in_csrf(client)
    pasted = "sk-test-with\nnewline-000000000000"
    response = await client.post(
        f"/admin/projects/{project_id}/integrations/openai/key", data={"csrf": csrf, "api_key": pasted, "mode": "edit"}
    )
    assert response.status_code == 422
    assert "May not hold control characters" in response.text
    assert "newline-000000000000" not in response.text


async def test_the_add_flow_asks_for_the_key_only_at_the_first_setup(
    client: httpx.AsyncClient, project_id: str
) -> None:
    await signed_in_csrf(client)
    page = await client.get(f"/admin/projects/{project_id}/add?provider=openai")
    assert 'name="api_key"' not in page.text
    assert "stored key is kept" in page.text
    csrf = csrf_of(page.text)
    response = await client.post(
        f"/admin/projects/{project_id}/add",
        data={"csrf": csrf, "provider": "openai", "name": "openai-second", "template": "openai-chat-completions"},
    )
    assert response.status_code == 422  # another account under a new name needs its own key
    assert "asked only this first time" in response.text


def field_error(html: str, field: str) -> str | None:
    """The error shown right after the field's input, if any."""
    match = re.search(rf'id="{field}"[^>]*>\s*<p class="field-error" role="alert">([^<]+)</p>', html)
    return match.group(1) if match else None


NOT_IN_RANGE = [str(2**64), str(2**70), "-1", "1e400", "nan", "inf", "ten"]


@pytest.mark.parametrize(
    ("field", "shown"),
    [
        ("timeout_seconds", "Must be a number above 0, at most 3600."),
        ("stream_idle_timeout_seconds", "Must be a number above 0, at most 3600."),
        ("total_timeout_seconds", "Must be a number above 0, at most 86400."),
    ],
)
async def test_an_integration_timeout_out_of_range_is_told_next_to_its_field(
    client: httpx.AsyncClient, ctx: Context, project_id: str, field: str, shown: str
) -> None:
    csrf = await signed_in_csrf(client)
    valid = {"csrf": csrf, "base_url": "https://api.openai.com/v1", "enabled": "on", "headers": "", "query": ""}
    valid |= {"timeout_seconds": "600", "stream_idle_timeout_seconds": "300", "total_timeout_seconds": "3600"}
    for value in NOT_IN_RANGE:
        response = await client.post(f"/admin/projects/{project_id}/integrations/openai", data=valid | {field: value})
        assert response.status_code == 422
        assert field_error(response.text, field) == shown, value
    integration = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert (integration.timeout_seconds, integration.stream_idle_timeout_seconds) == (600, 300)
    assert integration.total_timeout_seconds == 3600


@pytest.mark.parametrize(
    ("action", "field", "shown"),
    [
        ("", "rate_limit_per_minute", "Must be a whole number from 1 to 1000000."),
        ("", "max_concurrent_requests", "Must be a whole number from 1 to 100000."),
        ("/token/rotate", "grace_seconds", "Must be a whole number from 0 to 2592000."),
        ("/token/rotate", "expires_in_days", "Must be a whole number from 1 to 3650."),
    ],
)
async def test_a_project_number_out_of_range_is_told_next_to_its_field(
    client: httpx.AsyncClient, ctx: Context, project_id: str, action: str, field: str, shown: str
) -> None:
    csrf = await signed_in_csrf(client)
    before = await projects.get_project(ctx, project_id=project_id)
    for value in NOT_IN_RANGE:
        data = {"csrf": csrf, "name": "p", field: value}
        response = await client.post(f"/admin/projects/{project_id}{action}", data=data)
        assert response.status_code == 422
        assert field_error(response.text, field) == shown, value
        assert value not in response.text or len(value) < 5
    after = await projects.get_project(ctx, project_id=project_id)
    assert (after.rate_limit_per_minute, [token.id for token in after.tokens]) == (None, [t.id for t in before.tokens])


async def test_the_cap_on_requests_under_way_is_saved_shown_and_cleared(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}"
    form = {"csrf": csrf, "name": "p", "rate_limit_per_minute": "", "key_max_age_days": ""}
    saved = await client.post(page, data=form | {"max_concurrent_requests": "25"}, follow_redirects=True)
    assert "Project settings saved." in saved.text
    assert 'name="max_concurrent_requests" inputmode="numeric" value="25"' in saved.text
    assert (await projects.get_project(ctx, project_id=project_id)).max_concurrent_requests == 25
    await client.post(page, data=form | {"max_concurrent_requests": ""})
    assert (await projects.get_project(ctx, project_id=project_id)).max_concurrent_requests is None


async def test_the_stream_idle_timeout_is_shown_and_saved(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}/integrations/openai"
    assert 'name="stream_idle_timeout_seconds" value="300.0"' in (await client.get(page)).text
    data = {"csrf": csrf, "base_url": "https://api.openai.com/v1", "timeout_seconds": "600.0"}
    data |= {"stream_idle_timeout_seconds": "0.25", "total_timeout_seconds": "3600", "headers": "", "query": ""}
    assert (await client.post(page, data=data)).status_code == 303
    assert 'name="stream_idle_timeout_seconds" value="0.25"' in (await client.get(page)).text
