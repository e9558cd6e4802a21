"""Roles in the panel: every page and form of it, walked from its routes, for an owner, a viewer of every project,
a viewer of one project and a project admin of one (README, Roles). A refused page or form answers the 403 page,
with its way back; a viewer's pages hold no form but the sign-out."""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from credgate.admin_ui import create_panel
from credgate.app import create_app
from credgate.config import Settings
from credgate.services import admins, integrations, projects
from credgate.services.context import Context
from tests.admin_ui.test_security import PASSWORD, csrf_of

KEY = "sk-test-panel-roles-key-0000efgh"
_PANEL = cast(Starlette, create_panel(lambda: cast(Context, None)).app)
# Pages anyone may reach, signed in or not (they check nothing of a role), and the sign-out, which every role has.
UNCHECKED = {"/", "/login", "/setup", "/logout", "/confirm"}  # a signed-in user confirms, whatever the role
PANEL_ROUTES = [
    (method, route.path)
    for route in _PANEL.routes
    if isinstance(route, Route) and route.path not in UNCHECKED
    for method in sorted(route.methods or ())
    if method != "HEAD"
]
# The GET pages that are a form to change something: refused as their POST is.
FORM_PAGES = {
    "/projects/{project_id}/add",
    "/projects/{project_id}/add/review",
    "/projects/{project_id}/custom",
    "/projects/{project_id}/integrations/{provider}/key",
    "/projects/{project_id}/integrations/{provider}/revoke",
    "/projects/{project_id}/integrations/{provider}/delete",
    "/projects/{project_id}/budgets/{budget_id}/remove",
    "/projects/{project_id}/integrations/{provider}/keys/{key_id}/remove",
    "/projects/{project_id}/webhooks/{webhook_id}/remove",
    "/projects/{project_id}/token/revoke",
    "/projects/{project_id}/delete",
    "/admins/users/{user_id}/delete",
    "/admins/tokens/{token_id}/revoke",
}
# The Admins page, even its reading, and every form of it are the owner's too.
ADMIN_PAGES = {(method, path) for method, path in PANEL_ROUTES if path.startswith("/admins")}
OWNER_ONLY = {
    ("POST", "/projects"),
    ("GET", "/audit/export"),  # the whole audit log, as the admin API's export: an owner's, not a viewer's of all
    ("GET", "/projects/{project_id}/delete"),
    ("POST", "/projects/{project_id}/delete"),
    *ADMIN_PAGES,
}


@dataclass(frozen=True)
class Setup:
    clients: dict[str, httpx.AsyncClient]
    csrf: dict[str, str]
    mine: str
    other: str


@pytest.fixture
async def setup(settings: Settings, ctx: Context) -> AsyncIterator[Setup]:
    mine, _ = await projects.create_project(ctx, name="mine", actor="tests")
    other, _ = await projects.create_project(ctx, name="other", actor="tests")
    for project in (mine, other):
        await integrations.add_template_integration(
            ctx, project_id=project.id, provider="openai", template_id="openai-chat-completions", api_key=KEY, actor="t"
        )
    grants = {
        "owner": ("owner", []),
        "viewer": ("viewer", []),
        "viewer_of_mine": ("viewer", [mine.id]),
        "admin_of_mine": ("project_admin", [mine.id]),
    }
    transport = httpx.ASGITransport(app=create_app(settings, context=ctx))
    clients, csrf = {}, {}
    for name, (role, granted) in grants.items():
        await admins.create_admin_user(
            ctx, username=name, password=PASSWORD, actor="tests", role=role, project_ids=granted
        )
        client = httpx.AsyncClient(transport=transport, base_url="http://credgate.test")
        form = await client.get("/admin/login")
        signed_in = await client.post(
            "/admin/login", data={"csrf": csrf_of(form.text), "username": name, "password": PASSWORD}
        )
        assert signed_in.status_code == 303
        clients[name] = client
        csrf[name] = csrf_of((await client.get("/admin/projects")).text)
    try:
        yield Setup(clients, csrf, mine.id, other.id)
    finally:
        for client in clients.values():
            await client.aclose()


def refused(principal: str, method: str, path: str, of_mine: bool) -> bool:
    """The README's table, written out apart from the code that enforces it."""
    changing = method == "POST" or path in FORM_PAGES
    if principal == "owner":
        return False
    if (method, path) in OWNER_ONLY:
        return True
    if "{project_id}" not in path:
        return changing  # the projects list and the audit log show each admin what it may read
    if principal == "viewer":
        return changing
    if principal == "viewer_of_mine":
        return changing or not of_mine
    return not of_mine  # admin_of_mine


def test_the_walk_covers_the_panel() -> None:
    assert ("POST", "/projects/{project_id}/integrations/{provider}/keys") in PANEL_ROUTES
    assert ("GET", "/audit/export") in PANEL_ROUTES
    assert {("GET", "/admins"), ("POST", "/admins/users"), ("POST", "/admins/tokens/{token_id}/role")} <= ADMIN_PAGES
    assert len(ADMIN_PAGES) == 10
    assert {path for _, path in PANEL_ROUTES} >= FORM_PAGES


def _url(path: str, project_id: str) -> str:
    values = {"project_id": project_id, "provider": "openai", "key_id": "key_x", "budget_id": "bud_x"}
    values |= {"user_id": "usr_x", "token_id": "adm_x"}  # no admin's: the owner's call changes nobody
    return "/admin" + path.format_map({"webhook_id": "whk_x", **values})


@pytest.fixture
def backend() -> str:
    """The policy is decided before any query: one database is enough (tests/storage migrates both)."""
    return "sqlite"


# Those refused first: a check made before the handler answers 403 whatever an allowed change did before it.
PRINCIPALS = ["viewer", "viewer_of_mine", "admin_of_mine", "owner"]


@pytest.mark.parametrize(("method", "path"), PANEL_ROUTES)
async def test_each_role_reaches_only_what_it_may(setup: Setup, method: str, path: str) -> None:
    for principal in PRINCIPALS:
        client = setup.clients[principal]
        for project_id, of_mine in ((setup.other, False), (setup.mine, True)):  # the other first: nothing changes
            data = {"csrf": setup.csrf[principal]} if method == "POST" else None
            response = await client.request(method, _url(path, project_id), data=data)
            if refused(principal, method, path, of_mine):
                assert response.status_code == 403, (principal, method, path, project_id)
                assert "role" in response.text
                assert 'href="/admin/projects"' in response.text  # the way back
            else:
                assert response.status_code != 403, (principal, method, path, project_id, response.text[:2000])
            if "{project_id}" not in path:
                break


@pytest.mark.parametrize("principal", ["viewer", "viewer_of_mine"])
async def test_a_viewer_sees_no_form_but_the_sign_out_and_disabled_settings(setup: Setup, principal: str) -> None:
    client = setup.clients[principal]
    base = f"/admin/projects/{setup.mine}"
    for url in ("/admin/projects", base, f"{base}/budgets", f"{base}/webhooks", f"{base}/integrations/openai/keys"):
        page = (await client.get(url)).text
        enabled = page.count('method="post"') - page.count("disabled>")
        assert enabled == 1, url  # the sign-out
        assert "key?mode=" not in page, url
        for hidden in ("/add", "/custom", "/delete", "/remove", "/revoke"):
            assert f'{hidden}"' not in page, (url, hidden)


async def test_the_projects_page_lists_only_what_the_role_may_read(setup: Setup) -> None:
    page = (await setup.clients["admin_of_mine"].get("/admin/projects")).text
    assert setup.mine in page
    assert setup.other not in page
    assert "Create project" not in page
    assert "Create project" in (await setup.clients["owner"].get("/admin/projects")).text


async def test_a_project_admin_changes_its_project(setup: Setup) -> None:
    client = setup.clients["admin_of_mine"]
    data = {"csrf": setup.csrf["admin_of_mine"], "name": "renamed"}
    assert (await client.post(f"/admin/projects/{setup.mine}", data=data)).status_code == 303
    assert "renamed" in (await client.get(f"/admin/projects/{setup.mine}")).text
    assert "Delete project" not in (await client.get(f"/admin/projects/{setup.mine}")).text


async def test_a_changed_role_applies_from_the_next_page(setup: Setup, ctx: Context) -> None:
    client, url = setup.clients["viewer_of_mine"], f"/admin/projects/{setup.mine}"
    data = {"csrf": setup.csrf["viewer_of_mine"], "name": "renamed"}
    assert (await client.post(url, data=data)).status_code == 403
    await admins.set_admin_role(
        ctx, username="viewer_of_mine", role="project_admin", project_ids=[setup.mine], actor="tests"
    )
    assert (await client.post(url, data=data)).status_code == 303
