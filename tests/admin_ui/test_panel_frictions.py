"""What a new admin stumbled on in the panel, in process: the project token's revocation asks first and its
rotation keeps the previous token for an hour unless told otherwise; the sign-in page tells of the first-run
setup link and a used link says so; the audit log names projects; the favicon; the charts' labels; the skip link
and the small-screen tables' column names."""

import itertools
import re
from datetime import timedelta

import httpx
import pytest

from credgate.admin_ui.charts import CHAR_WIDTH, WIDTH, bars
from credgate.services import panel_sessions, projects
from credgate.services.access import resolve_access
from credgate.services.context import Context
from tests.admin_ui.test_pages import shown_token
from tests.admin_ui.test_security import PASSWORD, csrf_of, signed_in_csrf


@pytest.fixture
def backend() -> str:
    """Pages and forms, not storage: SQLite only (the service and storage tests cover PostgreSQL)."""
    return "sqlite"


async def test_revoking_the_project_token_asks_first_and_says_what_it_cuts_off(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    await signed_in_csrf(client)
    _, token = await projects.rotate_project_token(ctx, project_id=project_id, actor="t")
    page = f"/admin/projects/{project_id}"
    shown = (await client.get(page)).text
    assert 'action="/admin/projects/' + project_id + '/token/revoke"' not in shown, "no one-click revocation"
    assert f'href="{page}/token/revoke"' in shown
    confirm = await client.get(f"{page}/token/revoke")
    assert confirm.status_code == 200
    assert "Every client that sends it gets 401 at once" in confirm.text
    assert f'action="{page}/token/revoke"' in confirm.text
    assert await resolve_access(ctx, token=token, provider="openai") is not None  # asking changed nothing
    revoked = await client.post(f"{page}/token/revoke", data={"csrf": csrf_of(confirm.text)}, follow_redirects=True)
    assert "Project token revoked" in revoked.text
    assert await resolve_access(ctx, token=token, provider="openai") is None


async def test_a_rotation_keeps_the_previous_token_for_an_hour_unless_told_otherwise(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    _, before = await projects.rotate_project_token(ctx, project_id=project_id, actor="t")
    page = f"/admin/projects/{project_id}"
    shown = (await client.get(page)).text
    assert re.search(r'<input id="grace_seconds" name="grace_seconds"[^>]* value="3600"', shown), "1 hour is offered"
    assert {"0", "300", "3600", "86400", "604800"} <= set(re.findall(r'<option value="(\d+)" label=', shown))
    rotated = await client.post(f"{page}/token/rotate", data={"csrf": csrf, "grace_seconds": "3600"})
    flash = (await client.get(rotated.headers["location"])).text
    assert "the previous token keeps working for 1 hour" in flash
    assert shown_token(flash) is not None
    now = ctx.clock()
    ctx.clock = lambda: now + timedelta(minutes=59)
    assert await resolve_access(ctx, token=before, provider="openai") is not None
    ctx.clock = lambda: now + timedelta(minutes=61)
    assert await resolve_access(ctx, token=before, provider="openai") is None


async def test_a_rotation_with_the_overlap_left_empty_keeps_the_previous_token_for_an_hour(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    _, before = await projects.rotate_project_token(ctx, project_id=project_id, actor="t")
    data = {"csrf": csrf, "grace_seconds": "", "expires_in_days": ""}
    await client.post(f"/admin/projects/{project_id}/token/rotate", data=data)
    now = ctx.clock()
    ctx.clock = lambda: now + timedelta(minutes=59)
    assert await resolve_access(ctx, token=before, provider="openai") is not None


async def test_the_sign_in_page_tells_of_the_setup_link_while_no_admin_exists(
    client: httpx.AsyncClient, ctx: Context
) -> None:
    first_run = (await client.get("/admin/login")).text
    assert "No admin account exists yet" in first_run
    assert "<code>credgate serve</code> printed a one-time setup link" in first_run
    await panel_sessions.redeem_setup_token(ctx, token=await _setup_token(ctx), username="first", password=PASSWORD)
    assert "No admin account exists yet" not in (await client.get("/admin/login")).text


async def _setup_token(ctx: Context) -> str:
    token = await panel_sessions.issue_setup_token(ctx)
    assert token is not None
    return token


async def test_a_used_setup_link_says_it_was_used_and_leads_to_the_sign_in(
    client: httpx.AsyncClient, ctx: Context
) -> None:
    token = await _setup_token(ctx)
    form = {"token": token, "username": "first", "password": PASSWORD, "password_again": PASSWORD}
    assert (await client.post("/admin/setup", data=form)).status_code == 303
    for used in (
        await client.get("/admin/setup", params={"token": token}),
        await client.post("/admin/setup", data=form),
    ):
        assert used.status_code == 404
        assert "This setup link is not valid any more: it has been used already" in used.text
        assert '<a class="button" href="/admin/login">Sign in</a>' in used.text


async def test_a_setup_link_never_issued_says_where_a_valid_one_comes_from(
    client: httpx.AsyncClient, ctx: Context
) -> None:
    await _setup_token(ctx)
    refused = await client.get("/admin/setup", params={"token": "not-the-printed-one"})
    assert refused.status_code == 404
    assert "This setup link is not valid" in refused.text
    assert "used already" not in refused.text
    assert "each start of <code>credgate serve</code> prints a new one-time setup link" in refused.text


async def test_the_audit_log_names_each_project_with_its_id_and_keeps_a_deleted_ones_id(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    await signed_in_csrf(client)
    kept, _ = await projects.create_project(ctx, name="Billing backend", actor="t")
    gone, _ = await projects.create_project(ctx, name="Old prototype", actor="t")
    await projects.delete_project(ctx, project_id=gone.id, actor="t")
    page = (await client.get("/admin/audit")).text
    named = (
        f'<a class="name" href="/admin/projects/{kept.id}">Billing backend</a><br><code class="muted">{kept.id}</code>'
    )
    assert named in page
    assert f'<code>{gone.id}</code><br><span class="muted">deleted</span>' in page
    assert "Old prototype" not in page  # its name is gone with it; its id stays readable


async def test_every_page_shows_the_favicon_the_panel_serves(client: httpx.AsyncClient) -> None:
    login = (await client.get("/admin/login")).text
    assert '<link rel="icon" href="/admin/static/favicon.svg" type="image/svg+xml">' in login
    icon = await client.get("/admin/static/favicon.svg")
    assert (icon.status_code, icon.headers["content-type"]) == (200, "image/svg+xml")
    assert icon.text.startswith("<svg")


async def test_every_page_starts_with_a_skip_link_to_its_content(client: httpx.AsyncClient, project_id: str) -> None:
    await signed_in_csrf(client)
    for path in ("/admin/login", f"/admin/projects/{project_id}", "/admin/audit"):
        page = (await client.get(path)).text
        body = page.split("<body>", 1)[1].lstrip()
        assert body.startswith('<a class="skip-link" href="#main">Skip to the content</a>'), path
        assert '<main id="main" tabindex="-1">' in page


async def test_the_key_table_names_each_cell_for_small_screens(client: httpx.AsyncClient, project_id: str) -> None:
    await signed_in_csrf(client)
    page = (await client.get(f"/admin/projects/{project_id}")).text
    table = page.split('<table class="keys">', 1)[1].split("</table>", 1)[0]
    headers = re.findall(r'<th scope="col">([^<]+)</th>', table)
    row = table.split("<tbody>", 1)[1]
    assert re.findall(r'<td[^>]* data-label="([^"]+)"', row) == headers


@pytest.mark.parametrize("days", [7, 14, 30])
def test_a_charts_day_labels_stay_within_it_and_today_is_always_labelled(days: int) -> None:
    points = [(f"11-{day:02d}", day) for day in range(1, days + 1)]
    shown = [bar for bar in bars(points) if bar.tick]
    assert shown[-1].tick == "11-" + f"{days:02d}"
    for bar in shown:
        half = len(bar.tick) * CHAR_WIDTH / 2
        assert bar.middle - half >= 0, bar
        assert bar.middle + half <= WIDTH, bar
    for left, right in itertools.pairwise(shown):
        assert left.middle + len(left.tick) * CHAR_WIDTH / 2 < right.middle - len(right.tick) * CHAR_WIDTH / 2


def test_a_long_provider_name_is_shortened_under_its_bar_and_whole_in_its_title() -> None:
    name = "a-provider-whose-name-is-as-long-as-a-dns-label-may-be-0123456"
    shown = bars([("openai", 3), (name, 5)])
    assert [bar.label for bar in shown] == ["openai", name]
    assert shown[0].tick == "openai"
    assert shown[1].tick.endswith("…")
    assert shown[1].middle + len(shown[1].tick) * CHAR_WIDTH / 2 <= WIDTH
