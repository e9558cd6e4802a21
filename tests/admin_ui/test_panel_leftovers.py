"""The panel's last frictions, in process: a key saved from the pool page or Add new API is checked with the provider
when asked (and the box is offered only with a verifier); the pool table's Actions cell is named for small screens;
an error page keeps the signed-in admin's navigation, and a signed-out visitor gets a way to sign in."""

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from credgate.admin_ui import create_panel
from credgate.resolved import ResolvedIntegration
from credgate.services import panel_sessions, projects
from credgate.services.context import Context
from credgate.services.verification import KeyVerifier, Verification, verdict
from credgate.specs import Endpoint
from tests.admin_ui.conftest import KEY
from tests.admin_ui.test_security import PASSWORD, csrf_of
from tests.secret_sweep import SWEEP

NEW_KEY = "sk-test-panel-leftovers-key-00nmop"
SWEEP.register(NEW_KEY)
CHECKBOX = "Check the key with the provider after saving"


@pytest.fixture
def backend() -> str:
    """Pages and forms, not storage: SQLite only (the service and storage tests cover PostgreSQL)."""
    return "sqlite"


@dataclass
class Provider:
    """A stand-in for the data plane's verification call: records which key it was given, answers `status`."""

    status: int = 401
    keys: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # "METHOD path" of each

    async def __call__(self, *, project_id: str, integration: ResolvedIntegration, call: Endpoint) -> Verification:
        assert integration.credential is not None
        self.keys.append(integration.credential.reveal())
        self.calls.append(f"{call.method} {call.path}")
        return verdict(self.status)


Panel = Callable[[KeyVerifier | None], httpx.AsyncClient]


@pytest.fixture
async def panel(ctx: Context, project_id: str) -> AsyncIterator[Panel]:
    """The panel alone (with the verifier given, or none), signed in as the conftest's admin once for all."""
    secret, _ = await panel_sessions.sign_in(ctx, username="admin", password=PASSWORD)
    opened: list[httpx.AsyncClient] = []

    def open_panel(verifier: KeyVerifier | None) -> httpx.AsyncClient:
        app = Starlette(routes=[Mount("/admin", create_panel(lambda: ctx, verifier))])
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://credgate.test",
            cookies={"credgate_session": secret},
            event_hooks={"response": [_sweep]},
        )
        opened.append(client)
        return client

    yield open_panel
    for client in opened:
        await client.aclose()


async def _sweep(response: httpx.Response) -> None:
    await response.aread()
    SWEEP.capture(f"response {response.request.method} {response.request.url.path}", response.text)


async def test_a_key_added_to_the_pool_is_checked_with_the_provider_when_asked(panel: Panel, project_id: str) -> None:
    provider = Provider(status=401)
    client = panel(provider)
    page = f"/admin/projects/{project_id}/integrations/openai/keys"
    form = (await client.get(page)).text
    assert re.search(rf'<input type="checkbox" name="verify" value="1" > {CHECKBOX}</label>', form), "offered, unticked"
    data = {"csrf": csrf_of(form), "label": "backup", "api_key": NEW_KEY}
    added = await client.post(page, data=data | {"verify": "1"}, follow_redirects=True)
    assert provider.keys == [NEW_KEY], "the new key, not the first of the pool"
    assert "Key added to openai: it is in service now. Verification: the provider refused the key (status 401)." in (
        added.text
    )
    await client.post(page, data=data | {"label": "unchecked"})
    assert provider.keys == [NEW_KEY], "unticked: no call"
    for shown in (form, added.text):
        assert NEW_KEY not in shown
        assert KEY not in shown


async def test_a_new_api_saved_with_the_box_ticked_says_the_provider_accepted_its_key(
    panel: Panel, ctx: Context
) -> None:
    provider = Provider(status=200)
    client = panel(provider)
    project, _ = await projects.create_project(ctx, name="fresh", actor="t")
    base = f"/admin/projects/{project.id}"
    csrf = csrf_of((await client.get(f"{base}/add?provider=openai")).text)
    data = {"csrf": csrf, "provider": "openai", "name": "openai", "template": "openai-chat-completions"}
    assert (await client.post(f"{base}/add", data=data | {"api_key": NEW_KEY})).status_code == 303
    review = (await client.get(f"{base}/add/review")).text
    assert CHECKBOX in review
    saved = await client.post(f"{base}/add/review", data={"csrf": csrf, "verify": "1"}, follow_redirects=True)
    assert "openai set up. Verification: the provider accepted the key (status 200)." in saved.text
    assert provider.keys == [NEW_KEY]
    for shown in (review, saved.text):
        assert NEW_KEY not in shown


async def test_without_a_verifier_no_box_and_the_pool_table_names_every_cell(
    panel: Panel, ctx: Context, project_id: str
) -> None:
    client = panel(None)
    page = (await client.get(f"/admin/projects/{project_id}/integrations/openai/keys")).text
    assert CHECKBOX not in page
    table = page.split('<table class="keys pool">', 1)[1].split("</table>", 1)[0]
    headers = re.findall(r'<th scope="col">([^<]+)</th>', table)
    assert re.findall(r'<td[^>]* data-label="([^"]+)"', table.split("<tbody>", 1)[1]) == headers
    assert headers[-1] == "Actions"
    project, _ = await projects.create_project(ctx, name="fresh", actor="t")
    csrf = csrf_of(page)
    data = {"csrf": csrf, "provider": "openai", "name": "openai", "template": "openai-chat-completions"}
    await client.post(f"/admin/projects/{project.id}/add", data=data | {"api_key": NEW_KEY})
    review = (await client.get(f"/admin/projects/{project.id}/add/review")).text
    assert "Review and save" in review
    assert CHECKBOX not in review
    for shown in (page, review):
        assert KEY not in shown
        assert NEW_KEY not in shown


async def test_an_error_page_keeps_the_navigation_of_the_signed_in_admin(
    panel: Panel, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = panel(None)
    for path in ("/admin/projects/no-such-project", "/admin/no-such-page"):  # a ServiceError, an HTTPException
        missing = await client.get(path)
        assert missing.status_code == 404
        assert "Sign out admin</button>" in missing.text
        assert '<a class="button" href="/admin/projects">Back to projects</a>' in missing.text
        assert 'href="/admin/login"' not in missing.text
        assert KEY not in missing.text

    async def broken(ctx: Context, *, secret: str) -> None:
        raise RuntimeError("the database is away")

    monkeypatch.setattr("credgate.admin_ui.app.resume_session", broken)
    signed_out = panel(None)
    signed_out.cookies.clear()
    for shown in (await client.get("/admin/no-such-page"), await signed_out.get("/admin/no-such-page")):
        assert shown.status_code == 404  # a session that cannot be resumed, or none: signed out, never a 500
        assert "Sign out" not in shown.text
        assert '<a class="button secondary" href="/admin/login">Sign in</a>' in shown.text
        assert '<a class="button" href="/admin/projects">Back to projects</a>' in shown.text
