"""Admins at the admin API: an owner lists, adds, gives roles to and removes panel users and admin tokens; a new
token's value is in its creation's answer only; the gateway always keeps an owner. Who else is refused is walked
in tests/admin_api/test_roles.py."""

import asyncio
from typing import get_args

import httpx
import pytest

from credgate.admin_api.schemas import RoleName
from credgate.errors import Conflict
from credgate.roles import ROLES
from credgate.services import admins, panel_sessions, projects
from credgate.services.context import Context
from tests.admin_api.test_error_shape import service_error
from tests.conftest import POSTGRES_URL
from tests.reliability.test_auth_isolation import (  # noqa: F401  (an autouse fixture: quick argon2 here)
    _quick_password_hashing,
)

PASSWORD = "a long enough password"


@pytest.fixture
def backend() -> str:
    """What is tested here is the API's and the services' (the last-owner lock runs on both, below)."""
    return "sqlite"


async def test_an_owner_manages_panel_users(client: httpx.AsyncClient, ctx: Context) -> None:
    assert get_args(RoleName) == ROLES  # the API's choices are the roles
    project, _ = await projects.create_project(ctx, name="granted", actor="tests")
    created = await client.post(
        "/api/v1/admin-users",
        json={"username": "ann", "password": PASSWORD, "role": "project_admin", "project_ids": [project.id]},
    )
    assert created.status_code == 201, created.text
    assert created.json() | {"id": "", "created_at": ""} == {
        "id": "",
        "username": "ann",
        "sign_in": "password",
        "role": "project_admin",
        "project_ids": [project.id],
        "created_at": "",
    }
    sso = await client.post("/api/v1/admin-users", json={"username": "bo@example.com", "single_sign_on": True})
    assert (sso.status_code, sso.json()["sign_in"], sso.json()["role"]) == (201, "single_sign_on", "owner")

    listed = await client.get("/api/v1/admin-users")
    assert [(user["username"], user["sign_in"]) for user in listed.json()["items"]] == [
        ("ann", "password"),
        ("bo@example.com", "single_sign_on"),
    ]
    assert "argon2" not in listed.text
    assert PASSWORD not in listed.text + created.text

    changed = await client.patch("/api/v1/admin-users/ann", json={"role": "viewer"})
    assert (changed.status_code, changed.json()["role"], changed.json()["project_ids"]) == (200, "viewer", [])
    assert (await client.delete("/api/v1/admin-users/ann")).status_code == 204
    assert [user["username"] for user in (await client.get("/api/v1/admin-users")).json()["items"]] == [
        "bo@example.com"
    ]

    # Refusals: as the rest of the API, 422 naming the field, 404, 409.
    for body, field in (
        ({"username": "cy"}, "password"),
        ({"username": "cy", "password": PASSWORD, "single_sign_on": True}, "password"),
        ({"username": "cy", "password": "short"}, "password"),
        ({"username": "c y", "password": PASSWORD}, "username"),
        ({"username": "cy", "single_sign_on": True, "role": "root"}, "role"),
        ({"username": "cy", "single_sign_on": True, "role": "project_admin"}, "project_ids"),
        ({"username": "cy", "single_sign_on": True, "role": "viewer", "project_ids": ["prj_gone"]}, "project_ids"),
    ):
        refused = await client.post("/api/v1/admin-users", json=body)
        assert service_error(refused, 422).startswith(f"{field}: "), body
    duplicate = await client.post("/api/v1/admin-users", json={"username": "bo@example.com", "single_sign_on": True})
    assert service_error(duplicate, 409) == "user bo@example.com already exists"
    assert service_error(await client.patch("/api/v1/admin-users/nobody", json={"role": "viewer"}), 404)
    assert service_error(await client.delete("/api/v1/admin-users/nobody"), 404) == "no user nobody"
    assert service_error(await client.delete("/api/v1/admin-users/a%00b"), 404) == "no such user"
    actions = [event["action"] for event in (await client.get("/api/v1/audit")).json()["items"]]
    assert {"admin_user.create", "admin_user.set_role", "admin_user.delete"} <= set(actions)


async def test_an_admin_token_is_shown_once_then_changed_and_revoked(client: httpx.AsyncClient, ctx: Context) -> None:
    project, _ = await projects.create_project(ctx, name="granted", actor="tests")
    created = await client.post(
        "/api/v1/admin-tokens", json={"name": "ci", "role": "viewer", "project_ids": [project.id]}
    )
    assert created.status_code == 201, created.text
    secret, token = created.json()["secret"], created.json()["admin_token"]
    assert secret.startswith("cga_")
    assert secret.startswith(token["prefix"])
    assert (token["name"], token["role"], token["project_ids"], token["last_used_at"]) == (
        "ci",
        "viewer",
        [project.id],
        None,
    )

    as_ci = {"Authorization": f"Bearer {secret}"}
    assert (await client.get(f"/api/v1/projects/{project.id}", headers=as_ci)).status_code == 200
    listed = await client.get("/api/v1/admin-tokens")
    assert [each["name"] for each in listed.json()["items"]] == ["tests", "ci"]
    assert listed.json()["items"][1]["last_used_at"] is not None
    # The value once: in no list, audit entry or other answer after its creation.
    afterwards = [listed, await client.get("/api/v1/audit"), await client.get("/api/v1/admin-users")]
    for response in afterwards:
        assert secret not in response.text
        assert secret[len(token["prefix"]) :] not in response.text

    changed = await client.patch(f"/api/v1/admin-tokens/{token['id']}", json={"role": "project_admin"})
    assert service_error(changed, 422) == "project_ids: a project admin needs at least one project"
    changed = await client.patch(
        f"/api/v1/admin-tokens/{token['id']}", json={"role": "project_admin", "project_ids": [project.id]}
    )
    assert (changed.status_code, changed.json()["role"]) == (200, "project_admin")
    renamed = await client.patch(f"/api/v1/projects/{project.id}", json={"name": "by ci"}, headers=as_ci)
    assert renamed.status_code == 200  # the new role applies from the next request

    assert (await client.delete(f"/api/v1/admin-tokens/{token['id']}")).status_code == 204
    assert service_error(await client.get("/api/v1/projects", headers=as_ci), 401) == "invalid admin token"
    assert service_error(await client.delete(f"/api/v1/admin-tokens/{token['id']}"), 404) == "no such admin token"
    assert service_error(await client.patch("/api/v1/admin-tokens/adm_x", json={"role": "owner"}), 404)
    audit = (await client.get("/api/v1/audit")).json()["items"]
    assert {"admin_token.create", "admin_token.set_role", "admin_token.revoke"} <= {each["action"] for each in audit}
    assert next(each for each in audit if each["action"] == "admin_token.revoke")["detail"] == {"token_id": token["id"]}


@pytest.mark.parametrize(
    "backend",
    ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(not POSTGRES_URL, reason="no PostgreSQL"))],
)
async def test_the_last_owner_is_never_demoted_deleted_or_revoked(client: httpx.AsyncClient, ctx: Context) -> None:
    [own] = (await client.get("/api/v1/admin-tokens")).json()["items"]  # the client's own token, the only owner
    last = "admin token tests is the last owner: make another user or admin token an owner first"
    assert service_error(await client.patch(f"/api/v1/admin-tokens/{own['id']}", json={"role": "viewer"}), 409) == last
    assert service_error(await client.delete(f"/api/v1/admin-tokens/{own['id']}"), 409) == last

    await client.post("/api/v1/admin-users", json={"username": "ann", "single_sign_on": True, "role": "owner"})
    # Two owners, users and tokens together: the token may stop being one, and then ann is the last.
    assert (await client.patch(f"/api/v1/admin-tokens/{own['id']}", json={"role": "viewer"})).status_code == 200
    last = "user ann is the last owner: make another user or admin token an owner first"
    with pytest.raises(Conflict, match=last):
        await admins.set_admin_role(ctx, username="ann", role="viewer", actor="tests")
    with pytest.raises(Conflict, match=last):
        await admins.delete_admin_user(ctx, username="ann", actor="tests")

    await admins.set_admin_token_role(ctx, token_id=own["id"], role="owner", actor="tests")
    assert (await client.delete("/api/v1/admin-users/ann")).status_code == 204
    # An owner revokes its own token while another owner remains: its next request is refused.
    other, secret = await admins.issue_admin_token(ctx, name="other", actor="tests")
    as_other = {"Authorization": f"Bearer {secret}"}
    assert (await client.delete(f"/api/v1/admin-tokens/{other.id}", headers=as_other)).status_code == 204
    assert service_error(await client.get("/api/v1/admin-tokens", headers=as_other), 401)
    roles = [(each.name, each.role) for each in await admins.list_admin_tokens(ctx)]
    assert (roles, await admins.list_admin_users(ctx)) == ([("tests", "owner")], [])

    # Two owners removed at once: the owners are locked, so the second sees the first gone and is refused.
    await admins.create_admin_user(ctx, username="cy", password=None, actor="tests")
    outcomes = await asyncio.gather(
        admins.revoke_admin_token(ctx, token_id=own["id"], actor="tests"),
        admins.delete_admin_user(ctx, username="cy", actor="tests"),
        return_exceptions=True,
    )
    assert sorted(type(each).__name__ for each in outcomes) == ["Conflict", "NoneType"]


async def test_an_owner_ends_every_panel_session_of_a_user_at_once(client: httpx.AsyncClient, ctx: Context) -> None:
    await admins.create_admin_user(ctx, username="ann", password=PASSWORD, actor="tests")
    await admins.create_admin_user(ctx, username="bo", password=PASSWORD, actor="tests")
    laptop, _ = await panel_sessions.sign_in(ctx, username="ann", password=PASSWORD)
    phone, _ = await panel_sessions.sign_in(ctx, username="ann", password=PASSWORD)
    others, _ = await panel_sessions.sign_in(ctx, username="bo", password=PASSWORD)

    ended = await client.delete("/api/v1/admin-sessions/ann")
    assert (ended.status_code, ended.json()) == (200, {"ended": 2})
    assert await panel_sessions.resume_session(ctx, secret=laptop) is None
    assert await panel_sessions.resume_session(ctx, secret=phone) is None
    assert await panel_sessions.resume_session(ctx, secret=others) is not None  # another user's are kept
    again, _ = await panel_sessions.sign_in(ctx, username="ann", password=PASSWORD)  # the user is not locked out
    assert await panel_sessions.resume_session(ctx, secret=again) is not None

    assert (await client.delete("/api/v1/admin-sessions/bo")).json() == {"ended": 1}
    assert (await client.delete("/api/v1/admin-sessions/bo")).json() == {"ended": 0}
    assert service_error(await client.delete("/api/v1/admin-sessions/nobody"), 404) == "no user nobody"
    entries = (await client.get("/api/v1/audit")).json()["items"]
    assert [entry["detail"] for entry in entries if entry["action"] == "admin_user.end_sessions"] == [
        {"username": "bo"},
        {"username": "bo"},
        {"username": "ann"},
    ]
