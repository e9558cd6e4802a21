"""The panel's private_networks: a textarea (one entry per line) with its warning on the settings and Custom
Configure pages, validated next to the field, saved normalised, and shown in the audit log."""

import re

import httpx
import pytest

from credgate.services import admins, integrations, projects
from credgate.services.context import Context
from tests.admin_ui.test_security import PASSWORD, signed_in_csrf
from tests.secret_sweep import SWEEP

KEY = "sk-test-panel-private-networks-0abc"
OLLAMA = "http://127.0.0.1:11434"
WARNING = "each entry lets this integration alone reach a private address or plain http"


@pytest.fixture
async def project_id(ctx: Context) -> str:
    """A project with an integration `ollama` listing 127.0.0.1, the guard on for the services."""
    SWEEP.register(KEY)
    ctx.allow_private_upstreams = False
    await admins.create_admin_user(ctx, username="admin", password=PASSWORD, actor="tests")
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    await integrations.add_custom_integration(
        ctx,
        project_id=project.id,
        provider="ollama",
        base_url=OLLAMA,
        api_key=KEY,
        private_networks=["127.0.0.1"],
        actor="t",
    )
    return project.id


def settings_form(csrf: str, private_networks: str, base_url: str = OLLAMA) -> dict[str, str]:
    return {
        "csrf": csrf,
        "enabled": "on",
        "base_url": base_url,
        "timeout_seconds": "600",
        "stream_idle_timeout_seconds": "300",
        "total_timeout_seconds": "3600",
        "headers": "",
        "query": "",
        "private_networks": private_networks,
    }


def textarea(html: str) -> str:
    match = re.search(r'<textarea id="private_networks"[^>]*>([^<]*)</textarea>', html)
    assert match is not None
    return match.group(1)


def field_error(html: str) -> str | None:
    match = re.search(r'</textarea>\s*<p class="field-error" role="alert">([^<]+)</p>', html)
    return match.group(1) if match else None


async def test_the_settings_page_shows_saves_and_audits_the_list(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}/integrations/ollama"
    shown = (await client.get(page)).text
    assert (textarea(shown), WARNING in shown) == ("127.0.0.1/32\n", True)
    data = settings_form(csrf, "127.0.0.1\n\n  GPU-Box.  \n10.1.2.3/8\n", base_url="http://gpu-box:11434")
    assert (await client.post(page, data=data)).status_code == 303
    stored = await integrations.get_integration(ctx, project_id=project_id, provider="ollama")
    assert (stored.base_url, stored.private_networks) == (
        "http://gpu-box:11434",
        ["127.0.0.1/32", "gpu-box", "10.0.0.0/8"],
    )
    assert textarea((await client.get(page)).text) == "127.0.0.1/32\ngpu-box\n10.0.0.0/8\n"
    audit = (await client.get("/admin/audit")).text
    assert "integration.private_networks" in audit
    assert "private_networks: 127.0.0.1/32, gpu-box, 10.0.0.0/8" in audit


async def test_a_link_local_entry_is_told_next_to_the_field_and_nothing_changes(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}/integrations/ollama"
    response = await client.post(page, data=settings_form(csrf, "127.0.0.1\n169.254.169.254\n"))
    assert response.status_code == 422
    assert field_error(response.text) == (
        "Entry 2 may never include link-local (169.254.0.0/16, fe80::/10), cloud metadata or Teredo addresses."
    )
    stored = await integrations.get_integration(ctx, project_id=project_id, provider="ollama")
    assert stored.private_networks == ["127.0.0.1/32"]
    # The page saves its base URL too: without exceptions, it must be public again.
    cleared = await client.post(page, data=settings_form(csrf, ""))
    assert cleared.status_code == 422
    assert re.search(r'id="base_url"[^>]*>\s*<p class="field-error" role="alert">Must use https', cleared.text)
    public = await client.post(page, data=settings_form(csrf, "", base_url="https://93.184.216.34/v1"))
    assert public.status_code == 303
    stored = await integrations.get_integration(ctx, project_id=project_id, provider="ollama")
    assert (stored.base_url, stored.private_networks) == ("https://93.184.216.34/v1", [])


async def test_custom_configure_takes_the_list_with_its_warning(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}/custom"
    assert WARNING in (await client.get(page)).text
    data = {"csrf": csrf, "provider": "vllm", "base_url": "http://127.0.0.1:8000/v1", "api_key": KEY}
    refused = await client.post(page, data=data | {"private_networks": ""})
    assert refused.status_code == 422
    assert "Must use https" in refused.text, refused.text
    created = await client.post(page, data=data | {"private_networks": "127.0.0.1\n"})
    assert created.status_code == 303
    stored = await integrations.get_integration(ctx, project_id=project_id, provider="vllm")
    assert stored.private_networks == ["127.0.0.1/32"]
