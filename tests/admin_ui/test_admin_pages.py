"""The Admins page, an owner's: users added (password or single sign-on), given another role and deleted (their
sessions end at once), tokens created (the value shown once), changed and revoked, each removal confirmed first;
a refused form keeps what was typed and says why next to the field; the last owner is kept. Other roles are
refused it in tests/admin_ui/test_roles.py."""

import re

import httpx
import pytest

from credgate.services import admins
from credgate.services.context import Context
from tests.admin_ui.test_security import PASSWORD, csrf_of, signed_in_csrf

PAGE = "/admin/admins"


@pytest.fixture
def backend() -> str:
    return "sqlite"  # what is tested here is the panel's; the services' lock runs on both in tests/admin_api


async def _signed_in_as(client: httpx.AsyncClient, username: str) -> httpx.AsyncClient:
    """Another browser, signed in as `username`."""
    browser = httpx.AsyncClient(transport=client._transport, base_url=client.base_url)
    form = await browser.get("/admin/login")
    data = {"csrf": csrf_of(form.text), "username": username, "password": PASSWORD}
    assert (await browser.post("/admin/login", data=data)).status_code == 303
    return browser


def _row(page: str, name: str) -> str:
    """The table row naming `name`."""
    return next(row for row in page.split("<tr>") if f'<span class="name">{name}</span>' in row.split("</td>")[0])


async def test_an_owner_adds_users_changes_their_roles_and_deletes_them(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = (await client.get(PAGE)).text
    assert f'<a href="{PAGE}" aria-current="page">Admins</a>' in page
    assert "password" in _row(page, "admin")
    assert '<span class="badge">you</span>' in _row(page, "admin")
    headers = re.findall(r'<th scope="col">([^<]+)</th>', page.split("</table>", 1)[0])
    assert re.findall(r'<td[^>]* data-label="([^"]+)"', _row(page, "admin")) == headers  # labelled at 390 px

    grant = {"csrf": csrf, "role": "project_admin", "project_ids": [project_id]}
    added = await client.post(f"{PAGE}/users", data=grant | {"username": "ann", "password": PASSWORD})
    assert added.status_code == 303
    sso = {"csrf": csrf, "username": "bo@example.com", "sign_in": "single_sign_on", "role": "viewer"}
    page = (await client.get(PAGE)).text
    assert "User ann added: it signs in with the password you set." in page
    assert "Project admin" in _row(page, "ann")
    assert '<span class="name">p</span>' in _row(page, "ann")  # the granted project, by name
    page = (await client.post(f"{PAGE}/users", data=sso, follow_redirects=True)).text
    assert "single sign-on" in _row(page, "bo@example.com")
    assert "every project" in _row(page, "bo@example.com")

    # Refused: what was typed is kept (never the password), and why is said next to the field.
    short = await client.post(f"{PAGE}/users", data=grant | {"username": "cy", "password": "too short"})
    assert short.status_code == 422
    assert "The password must be at least 12 characters." in short.text
    assert 'value="cy"' in short.text
    assert f'value="{project_id}" checked' in short.text
    assert "too short" not in short.text
    taken = await client.post(f"{PAGE}/users", data=grant | {"username": "ann", "password": PASSWORD})
    assert (taken.status_code, "User ann already exists." in taken.text) == (409, True)
    no_project = grant | {"username": "cy", "sign_in": "single_sign_on", "project_ids": []}
    refused = await client.post(f"{PAGE}/users", data=no_project)
    assert "A project admin needs at least one project." in refused.text
    assert 'value="single_sign_on" checked' in refused.text

    # ann's own view: no Admins link, the page refused; then a new role from ann's next page.
    ann = await _signed_in_as(client, "ann")
    assert 'href="/admin/admins"' not in (await ann.get("/admin/projects")).text
    assert (await ann.get(PAGE)).status_code == 403
    [ann_user] = [user for user in await admins.list_admin_users(ctx) if user.username == "ann"]
    changed = await client.post(f"{PAGE}/users/{ann_user.id}/role", data={"csrf": csrf, "role": "owner"})
    assert changed.status_code == 303
    assert (await ann.get(PAGE)).status_code == 200

    confirm = await client.get(f"{PAGE}/users/{ann_user.id}/delete")
    assert "Delete user ann?" in confirm.text
    assert "each of its sessions ends at once" in confirm.text
    deleted = await client.post(f"{PAGE}/users/{ann_user.id}/delete", data={"csrf": csrf}, follow_redirects=True)
    assert "User ann deleted: its sessions have ended." in deleted.text
    gone = await ann.get("/admin/projects")
    assert (gone.status_code, gone.headers["location"]) == (303, "/admin/login")  # at once
    await ann.aclose()


async def test_an_admin_token_is_shown_once_then_changed_and_revoked(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    created = await client.post(
        f"{PAGE}/tokens", data={"csrf": csrf, "name": "ci", "role": "viewer"}, follow_redirects=True
    )
    assert "The admin token, shown this once" in created.text
    shown = re.search(r'<output id="new-secret" class="token">(cga_[A-Za-z0-9_-]+)</output>', created.text)
    assert shown is not None
    secret = shown.group(1)
    assert (await client.get("/api/v1/projects", headers={"Authorization": f"Bearer {secret}"})).status_code == 200
    page = (await client.get(PAGE)).text
    assert secret not in page  # once
    assert secret[8:] not in page
    [token] = [each for each in await admins.list_admin_tokens(ctx) if each.name == "ci"]
    assert f"<code>{token.prefix}…</code>" in _row(page, "ci")
    assert "Viewer" in _row(page, "ci")

    refused = await client.post(f"{PAGE}/tokens/{token.id}/role", data={"csrf": csrf, "role": "project_admin"})
    assert refused.status_code == 422
    assert "A project admin needs at least one project." in _row(refused.text, "ci")
    assert "<details open>" in _row(refused.text, "ci")
    assert '<option value="project_admin" selected>' in _row(refused.text, "ci")  # kept
    unnamed = await client.post(f"{PAGE}/tokens", data={"csrf": csrf, "name": "", "role": "viewer"})
    assert (unnamed.status_code, "The name must be 1 to 200 characters." in unnamed.text) == (422, True)
    grant = {"csrf": csrf, "role": "project_admin", "project_ids": [project_id]}
    changed = await client.post(f"{PAGE}/tokens/{token.id}/role", data=grant, follow_redirects=True)
    assert "Admin token ci is now project admin." in changed.text

    assert "Revoke admin token ci?" in (await client.get(f"{PAGE}/tokens/{token.id}/revoke")).text
    revoked = await client.post(f"{PAGE}/tokens/{token.id}/revoke", data={"csrf": csrf}, follow_redirects=True)
    assert "Admin token ci revoked" in revoked.text
    assert (await client.get("/api/v1/projects", headers={"Authorization": f"Bearer {secret}"})).status_code == 401
    for text in (changed.text, revoked.text):
        assert secret not in text


async def test_the_last_owner_is_kept(client: httpx.AsyncClient, ctx: Context, project_id: str) -> None:
    csrf = await signed_in_csrf(client)
    [tests_token] = await admins.list_admin_tokens(ctx)  # the API client's, an owner too: it may go
    revoked = await client.post(f"{PAGE}/tokens/{tests_token.id}/revoke", data={"csrf": csrf})
    assert revoked.status_code == 303
    [me] = await admins.list_admin_users(ctx)
    last = "User admin is the last owner: make another user or admin token an owner first."
    demoted = await client.post(f"{PAGE}/users/{me.id}/role", data={"csrf": csrf, "role": "viewer"})
    assert demoted.status_code == 409
    assert last in _row(demoted.text, "admin")
    deleted = await client.post(f"{PAGE}/users/{me.id}/delete", data={"csrf": csrf})
    assert (deleted.status_code, last in _row(deleted.text, "admin")) == (409, True)
    assert [(user.username, user.role) for user in await admins.list_admin_users(ctx)] == [("admin", "owner")]


async def test_an_owner_ends_a_users_sessions_and_its_next_page_asks_it_to_sign_in(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    await admins.create_admin_user(ctx, username="ann", password=PASSWORD, actor="tests")
    ann = await _signed_in_as(client, "ann")
    try:
        assert (await ann.get("/admin/projects")).status_code == 200
        row = _row((await client.get(PAGE)).text, "ann")
        user_id = re.findall(r"/admin/admins/users/([^/]+)/sessions/end", row)[0]
        ended = await client.post(f"{PAGE}/users/{user_id}/sessions/end", data={"csrf": csrf}, follow_redirects=True)
        assert "1 session of ann ended: it signs in again." in ended.text
        after = await ann.get("/admin/projects")
        assert (after.status_code, after.headers["location"]) == (303, "/admin/login")
        forged = await client.post(f"{PAGE}/users/{user_id}/sessions/end", data={"csrf": "forged"})
        assert forged.status_code == 403

        # Ending your own signs you out here too.
        row = _row((await client.get(PAGE)).text, "admin")
        mine = re.findall(r"/admin/admins/users/([^/]+)/sessions/end", row)[0]
        own = await client.post(f"{PAGE}/users/{mine}/sessions/end", data={"csrf": csrf})
        assert (own.status_code, own.headers["location"]) == (303, "/admin/login")
        assert (await client.get(PAGE)).status_code == 303
    finally:
        await ann.aclose()
