"""What the admin API could do and the panel could not: the audit log's export (the owner's, like the API's, and
the same bytes), and the check with the provider offered on the Edit/Rotate key form, and on a custom integration's
forms once its admin names the call that checks a key."""

import re

import httpx
import pytest

from credgate.audit_chain import verify_lines
from credgate.services import admins, audit, panel_sessions
from credgate.services.context import Context
from tests.admin_ui import test_panel_leftovers
from tests.admin_ui.conftest import KEY
from tests.admin_ui.test_panel_leftovers import CHECKBOX, NEW_KEY, Panel, Provider
from tests.admin_ui.test_security import PASSWORD, csrf_of
from tests.secret_sweep import SWEEP

OTHER_KEY = "sk-test-panel-parity-key-0000uvwx"
SWEEP.register(OTHER_KEY)
DOWNLOAD = "Download the whole audit log (JSON Lines)"
UNTICKED = rf'<input type="checkbox" name="verify" value="1" > {CHECKBOX}</label>'
TICKED = rf'<input type="checkbox" name="verify" value="1" checked> {CHECKBOX}</label>'
panel = test_panel_leftovers.panel  # the panel with a stand-in provider (or none), signed in as the owner


@pytest.fixture
def backend() -> str:
    """Pages and forms, not storage: SQLite only (the service and storage tests cover PostgreSQL)."""
    return "sqlite"


async def test_an_owner_downloads_the_chain_the_api_exports_and_the_cli_verifies(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    secret, _ = await panel_sessions.sign_in(ctx, username="admin", password=PASSWORD)
    client.cookies.set("credgate_session", secret)  # the same app: the panel and the admin API side by side
    page = (await client.get("/admin/audit")).text
    assert re.search(rf'<a [^>]*href="/admin/audit/export"[^>]*>{re.escape(DOWNLOAD)}</a>', page)
    downloaded = await client.get("/admin/audit/export")
    assert downloaded.status_code == 200
    assert downloaded.headers["content-type"] == "application/x-ndjson"
    day = ctx.clock().date().isoformat()
    assert downloaded.headers["content-disposition"] == f'attachment; filename="credgate-audit-{day}.jsonl"'
    assert downloaded.content == (await client.get("/api/v1/audit/export")).content
    chain = verify_lines(downloaded.content.splitlines(keepends=True))  # what `credgate audit verify FILE` runs
    stored = await audit.verify_audit_log(ctx)
    assert stored.verified
    assert (chain.entries, chain.head) == (stored.entries, stored.head)
    assert chain.entries >= 3  # the admin, the project, its integration
    assert KEY not in downloaded.text


async def test_only_an_owner_is_offered_the_export_and_served_it(panel: Panel, ctx: Context, project_id: str) -> None:
    client = panel(None)
    grants = {"viewer_of_p": ("viewer", [project_id]), "admin_of_p": ("project_admin", [project_id])}
    grants["viewer_of_all"] = ("viewer", [])  # reads every project, yet the export is the owner's, as in the API
    for name, (role, granted) in grants.items():
        await admins.create_admin_user(
            ctx, username=name, password=PASSWORD, actor="tests", role=role, project_ids=granted
        )
        secret, _ = await panel_sessions.sign_in(ctx, username=name, password=PASSWORD)
        client.cookies = httpx.Cookies({"credgate_session": secret})
        page = await client.get("/admin/audit")
        assert page.status_code == 200, name
        assert DOWNLOAD not in page.text, name
        assert "/admin/audit/export" not in page.text, name
        refused = await client.get("/admin/audit/export")
        assert refused.status_code == 403, name
        assert f"role ({role}) does not allow exporting the audit log" in refused.text
        assert "previous_hash" not in refused.text
        assert "content-disposition" not in refused.headers


async def test_the_edit_and_rotate_form_checks_the_saved_key_only_when_asked(panel: Panel, project_id: str) -> None:
    provider = Provider(status=200)
    client = panel(provider)
    url = f"/admin/projects/{project_id}/integrations/openai/key"
    form = (await client.get(url, params={"mode": "rotate"})).text
    assert re.search(UNTICKED, form), "offered, unticked"
    data = {"csrf": csrf_of(form), "mode": "rotate", "api_key": NEW_KEY}
    rotated = await client.post(url, data=data | {"verify": "1"}, follow_redirects=True)
    assert provider.keys == [NEW_KEY], "the key just saved"
    assert (
        "Key of openai rotated: requests from now on use the new key. "
        "Verification: the provider accepted the key (status 200)."
    ) in rotated.text
    edited = await client.post(url, data=data | {"mode": "edit", "api_key": OTHER_KEY}, follow_redirects=True)
    assert "Key of openai saved.</p>" in edited.text
    assert provider.keys == [NEW_KEY], "unticked: no call"
    refused = await client.post(url, data=data | {"api_key": " ", "verify": "1"})
    assert refused.status_code == 422
    assert re.search(TICKED, refused.text), "the box comes back as it was"
    assert provider.keys == [NEW_KEY]
    without = (await panel(None).get(url)).text
    assert CHECKBOX not in without
    for shown in (form, rotated.text, edited.text, refused.text, without):
        for key in (KEY, NEW_KEY, OTHER_KEY):
            assert key not in shown


async def test_a_custom_integration_without_a_verification_call_is_offered_no_check_that_could_confirm_nothing(
    panel: Panel, project_id: str
) -> None:
    """A hand-made integration has no template: until its admin names a verification call, no call could tell
    whether the provider takes its key, so its pages offer neither the box nor the Verify button (the template's
    integration beside it keeps both), and Custom Configure asks for the call when its box is ticked."""
    provider = Provider(status=200)
    client = panel(provider)
    url = f"/admin/projects/{project_id}/custom"
    form = (await client.get(url)).text
    assert 'name="verify_call"' in form
    assert re.search(UNTICKED, form), "offered, unticked: the form can name its call"
    data = {"csrf": csrf_of(form), "base_url": "https://api.example.com/v1", "auth_method": "bearer"}
    data |= {"api_key": NEW_KEY, "provider": "handmade"}
    asked = await client.post(url, data=data | {"verify": "1"})
    assert asked.status_code == 422
    assert "Name the call that checks the key, or leave the box unticked." in asked.text
    assert re.search(TICKED, asked.text), "the box comes back as it was"
    created = await client.post(url, data=data, follow_redirects=True)
    assert "handmade created. Now allow its endpoints.</p>" in created.text, "saved; nothing said of a check"
    pages = {}
    for provider_name in ("handmade", "openai"):
        base = f"/admin/projects/{project_id}/integrations/{provider_name}"
        pages[provider_name] = ((await client.get(f"{base}/key")).text, (await client.get(f"{base}/keys")).text)
    for page in pages["handmade"]:
        assert CHECKBOX not in page
        assert 'value="verify"' not in page
        assert "<em>Verify</em>" not in page
    key_form, pool = pages["openai"]
    assert CHECKBOX in key_form
    assert CHECKBOX in pool
    assert 'value="verify"' in pool
    assert "<em>Verify</em> it" in pool
    assert provider.keys == []  # nothing was called with a key
    for shown in (form, asked.text, created.text, *pages["handmade"], *pages["openai"]):
        for key in (KEY, NEW_KEY):
            assert key not in shown


async def test_a_custom_integration_checks_its_key_with_the_call_its_admin_names(panel: Panel, project_id: str) -> None:
    provider = Provider(status=200)
    client = panel(provider)
    url = f"/admin/projects/{project_id}/custom"
    form = (await client.get(url)).text
    data = {"csrf": csrf_of(form), "base_url": "https://api.example.com/v1", "auth_method": "bearer"}
    data |= {"api_key": NEW_KEY, "provider": "handmade", "verify": "1"}
    wrong = await client.post(url, data=data | {"verify_call": "DELETE accounts/me"})
    assert wrong.status_code == 422
    assert "The verification call: the method must be &#39;GET&#39; or &#39;POST&#39;." in wrong.text
    assert 'value="DELETE accounts/me"' in wrong.text, "what was typed comes back"
    assert provider.keys == []
    created = await client.post(url, data=data | {"verify_call": "get /me/"}, follow_redirects=True)
    assert "handmade created. Verification: the provider accepted the key (status 200). Now allow" in created.text
    assert (provider.keys, provider.calls) == ([NEW_KEY], ["GET me"])
    base = f"/admin/projects/{project_id}/integrations/handmade"
    pool = (await client.get(f"{base}/keys")).text
    assert 'value="verify"' in pool
    assert CHECKBOX in (await client.get(f"{base}/key")).text

    settings = (await client.get(base)).text
    assert 'name="verify_call" value="GET me"' in settings
    assert "Blank: none, so a key cannot be checked." in settings
    fields = {"csrf": csrf_of(settings), "enabled": "on", "base_url": "https://api.example.com/v1"}
    fields |= {"timeout_seconds": "600", "stream_idle_timeout_seconds": "300", "total_timeout_seconds": "3600"}
    refused = await client.post(base, data=fields | {"verify_call": "GET v1/*"})
    assert refused.status_code == 422
    assert "The verification call: the path may hold no wildcard: it names one path." in refused.text
    await client.post(base, data=fields | {"verify_call": "POST auth/check"})
    await client.post(base, data=fields)  # a page from before the field: the call stays
    assert 'name="verify_call" value="POST auth/check"' in (await client.get(base)).text
    key_page = re.search(rf'action="({base}/keys/[^"/]+)"', pool)
    assert key_page is not None
    await client.post(key_page.group(1), data={"csrf": csrf_of(pool), "action": "verify"})
    assert provider.calls[-1] == "POST auth/check"
    cleared = await client.post(base, data=fields | {"verify_call": " "}, follow_redirects=True)
    assert "Settings of handmade saved." in cleared.text
    assert 'value="verify"' not in (await client.get(f"{base}/keys")).text, "blank: no call, no Verify"

    openai = (await client.get(f"/admin/projects/{project_id}/integrations/openai")).text
    help_text = re.search(r'<p class="muted" id="verify_call_help">(.*?)</p>', openai)
    assert help_text is not None
    assert help_text.group(1).endswith("Blank: its template's, <code>GET models</code>."), help_text.group(1)
    for shown in (form, wrong.text, created.text, pool, settings, refused.text, cleared.text, openai):
        for key in (KEY, NEW_KEY):
            assert key not in shown
