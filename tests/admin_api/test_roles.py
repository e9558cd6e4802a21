"""Roles at the admin API: every route of it, walked from the app, for an owner, a viewer of every project, a
viewer of one project and a project admin of one (README, Roles). A refusal is 403 before the body is read; an
allowed call may still be 404 or 422 for the dummy path and body, but never 403."""

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from credgate.admin_api import routes
from credgate.app import create_app
from credgate.config import Settings
from credgate.services import admins, integrations, projects
from credgate.services.context import Context
from tests.admin_api.test_error_shape import service_error

KEY = "sk-test-" + "rolesrolesrolesroles" + "abcd"
# The routes of the admin API, and /metrics (the gateway's own; on the one listener, behind the admin token).
API_ROUTES = [
    (method, route.path)
    for route in routes.router.routes
    if isinstance(route, APIRoute)
    for method in sorted(route.methods or ())
]
ADMIN_ROUTES = [*API_ROUTES, ("GET", "/metrics")]
OWNER_ONLY = {
    ("POST", "/api/v1/projects"),
    ("DELETE", "/api/v1/projects/{project_id}"),
    ("GET", "/api/v1/audit/export"),
    *((method, "/api/v1/admin-users") for method in ("GET", "POST")),
    *((method, "/api/v1/admin-users/{username:path}") for method in ("PATCH", "DELETE")),
    *((method, "/api/v1/admin-tokens") for method in ("GET", "POST")),
    *((method, "/api/v1/admin-tokens/{token_id}") for method in ("PATCH", "DELETE")),
}
# Reads that name no project: each admin gets what it may see.
OPEN_READS = {"/api/v1/projects", "/api/v1/templates"}
# Reads of what belongs to every project: an owner's, or a viewer's granted no list.
WHOLE_READS = {"/api/v1/audit", "/metrics"}


@dataclass(frozen=True)
class Setup:
    client: httpx.AsyncClient
    mine: str  # the project granted to the limited roles
    other: str
    tokens: dict[str, str]


@pytest.fixture
async def setup(settings: Settings, ctx: Context) -> AsyncIterator[Setup]:
    mine, _ = await projects.create_project(ctx, name="mine", actor="tests")
    other, _ = await projects.create_project(ctx, name="other", actor="tests")
    for project in (mine, other):
        await integrations.add_template_integration(
            ctx,
            project_id=project.id,
            provider="openai",
            template_id="openai-chat-completions",
            api_key=KEY,
            actor="tests",
        )
    grants: dict[str, tuple[str, list[str]]] = {
        "owner": ("owner", []),
        "viewer": ("viewer", []),
        "viewer_of_mine": ("viewer", [mine.id]),
        "admin_of_mine": ("project_admin", [mine.id]),
    }
    tokens = {
        name: await admins.create_admin_token(ctx, name=name, actor="tests", role=role, project_ids=granted)
        for name, (role, granted) in grants.items()
    }
    transport = httpx.ASGITransport(app=create_app(settings, context=ctx))
    async with httpx.AsyncClient(transport=transport, base_url="http://credgate.test") as client:
        yield Setup(client, mine.id, other.id, tokens)


def refused(principal: str, method: str, path: str, of_mine: bool) -> bool:
    """The README's table, written out apart from the code that enforces it."""
    reading = method == "GET"
    if principal == "owner":
        return False
    if (method, path) in OWNER_ONLY:
        return True
    if "{project_id}" not in path:
        return path in WHOLE_READS and principal != "viewer" if reading else True
    if principal == "viewer":
        return not reading
    if principal == "viewer_of_mine":
        return not (reading and of_mine)
    return not of_mine  # admin_of_mine


def _api_routes(found: list[BaseRoute]) -> Iterator[APIRoute]:
    """The app's API routes, those of the routers it includes too (FastAPI keeps them as included routers)."""
    for route in found:
        if isinstance(route, APIRoute):
            yield route
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _api_routes(included.routes)


def test_the_walk_covers_every_admin_route_of_the_app(settings: Settings) -> None:
    """A route added to the app under /api/v1 is walked above, and it is authenticated and checked."""
    assert set(ADMIN_ROUTES) >= OWNER_ONLY
    app_routes = list(_api_routes(create_app(settings).control.routes))
    admin_routes = [each for each in app_routes if each.path.startswith("/api/v1")]
    assert {(method, route.path) for route in admin_routes for method in route.methods or ()} == set(API_ROUTES)
    assert all(isinstance(route, routes.AuthenticatedRoute) for route in admin_routes)


def _url(path: str, project_id: str) -> str:
    values = {"project_id": project_id, "provider": "openai", "key_id": "key_x", "budget_id": "bud_x"}
    # Admins no test principal is: the owner's call answers 404, and changes nobody.
    values |= {"username": "nobody", "token_id": "adm_x"}
    return path.replace(":path}", "}").format_map({**{"webhook_id": "whk_x"}, **values})


@pytest.fixture
def backend() -> str:
    """The policy is decided before any query: one database is enough (tests/storage migrates both)."""
    return "sqlite"


# Those refused first: a check made before the handler answers 403 whatever an allowed change did before it.
PRINCIPALS = ["viewer", "viewer_of_mine", "admin_of_mine", "owner"]


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
async def test_each_role_reaches_only_what_it_may(setup: Setup, method: str, path: str) -> None:
    for principal in PRINCIPALS:
        headers = {"Authorization": f"Bearer {setup.tokens[principal]}"}
        for project_id, of_mine in ((setup.other, False), (setup.mine, True)):  # the other first: nothing changes
            body: dict[str, Any] = {}
            response = await setup.client.request(method, _url(path, project_id), json=body, headers=headers)
            if refused(principal, method, path, of_mine):
                assert "role" in service_error(response, 403), (principal, method, path, project_id)
            else:
                assert response.status_code != 403, (principal, method, path, project_id, response.text)
            if "{project_id}" not in path:
                break


async def test_a_project_admin_manages_its_project_and_sees_only_it(setup: Setup) -> None:
    headers = {"Authorization": f"Bearer {setup.tokens['admin_of_mine']}"}
    listed = await setup.client.get("/api/v1/projects", headers=headers)
    assert [project["id"] for project in listed.json()["items"]] == [setup.mine]
    renamed = await setup.client.patch(f"/api/v1/projects/{setup.mine}", json={"name": "renamed"}, headers=headers)
    assert renamed.status_code == 200
    added = await setup.client.post(
        f"/api/v1/projects/{setup.mine}/webhooks", json={"url": "https://hooks.test/x"}, headers=headers
    )
    assert added.status_code == 201, added.text
    own_audit = await setup.client.get("/api/v1/audit", params={"project_id": setup.mine}, headers=headers)
    assert own_audit.status_code == 200
    assert (await setup.client.get(f"/api/v1/projects/{setup.other}", headers=headers)).status_code == 403


async def test_a_viewer_reads_every_project_and_changes_none(setup: Setup) -> None:
    headers = {"Authorization": f"Bearer {setup.tokens['viewer']}"}
    listed = await setup.client.get("/api/v1/projects", headers=headers)
    assert {project["id"] for project in listed.json()["items"]} == {setup.mine, setup.other}
    assert (await setup.client.get(f"/api/v1/projects/{setup.other}/integrations", headers=headers)).status_code == 200
    assert (await setup.client.get("/api/v1/audit", headers=headers)).status_code == 200
    refusal = await setup.client.patch(f"/api/v1/projects/{setup.mine}", json={"name": "x"}, headers=headers)
    assert service_error(refusal, 403) == (
        f"this admin token's role (viewer) does not allow changing project {setup.mine}"
    )
