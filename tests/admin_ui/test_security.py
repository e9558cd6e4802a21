"""The panel's defences, in process: CSRF, origin, session fixation, sign-out, timeouts, throttling, cookie
flags, security headers, and no stored key in any page."""

import re
from datetime import timedelta

import httpx
import pytest

from credgate.services import admins, integrations, projects
from credgate.services.context import Context
from tests.secret_sweep import SWEEP

PASSWORD = "correct horse battery staple"
KEY = "sk-test-panel-security-key-00wxyz"


@pytest.fixture
async def admin(ctx: Context) -> str:
    await admins.create_admin_user(ctx, username="admin", password=PASSWORD, actor="tests")
    return "admin"


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match is not None
    return match.group(1)


async def sign_in(client: httpx.AsyncClient, password: str = PASSWORD) -> httpx.Response:
    form = await client.get("/admin/login")
    data = {"csrf": csrf_of(form.text), "username": "admin", "password": password}
    return await client.post("/admin/login", data=data)


async def signed_in_csrf(client: httpx.AsyncClient) -> str:
    assert (await sign_in(client)).status_code == 303
    return csrf_of((await client.get("/admin/projects")).text)


async def test_a_page_needs_a_signed_in_admin(client: httpx.AsyncClient, admin: str) -> None:
    response = await client.get("/admin/projects")
    assert (response.status_code, response.headers["location"]) == (303, "/admin/login")


async def test_a_form_without_the_session_csrf_token_is_refused(client: httpx.AsyncClient, admin: str) -> None:
    csrf = await signed_in_csrf(client)
    assert (await client.post("/admin/projects", data={"name": "x"})).status_code == 403
    assert (await client.post("/admin/projects", data={"name": "x", "csrf": "forged"})).status_code == 403
    assert (await client.post("/admin/projects", data={"name": "x", "csrf": csrf})).status_code == 303


async def test_a_form_from_another_origin_is_refused(client: httpx.AsyncClient, admin: str) -> None:
    csrf = await signed_in_csrf(client)
    response = await client.post(
        "/admin/projects", data={"name": "x", "csrf": csrf}, headers={"Origin": "https://evil.test"}
    )
    assert response.status_code == 403


async def test_sign_in_needs_its_own_csrf_cookie(client: httpx.AsyncClient, admin: str) -> None:
    form = await client.get("/admin/login")
    client.cookies.clear()
    response = await client.post(
        "/admin/login", data={"csrf": csrf_of(form.text), "username": "admin", "password": PASSWORD}
    )
    assert response.status_code == 403


async def test_sign_in_issues_a_new_session_id(client: httpx.AsyncClient, admin: str) -> None:
    client.cookies.set("credgate_session", "chosen-by-an-attacker")
    response = await sign_in(client)
    issued = response.cookies["credgate_session"]
    assert issued != "chosen-by-an-attacker"
    attacker = httpx.AsyncClient(transport=client._transport, base_url=client.base_url)
    attacker.cookies.set("credgate_session", "chosen-by-an-attacker")
    assert (await attacker.get("/admin/projects")).status_code == 303


async def test_sign_out_ends_the_session(client: httpx.AsyncClient, admin: str) -> None:
    csrf = await signed_in_csrf(client)
    session = client.cookies["credgate_session"]
    assert (await client.post("/admin/logout", data={"csrf": csrf})).status_code == 303
    client.cookies.set("credgate_session", session)  # a copy kept by someone
    assert (await client.get("/admin/projects")).status_code == 303


@pytest.mark.parametrize(("idle", "expired"), [(timedelta(minutes=29), False), (timedelta(minutes=31), True)])
async def test_an_idle_session_expires(
    client: httpx.AsyncClient, ctx: Context, admin: str, idle: timedelta, expired: bool
) -> None:
    await signed_in_csrf(client)
    now = ctx.clock()
    ctx.clock = lambda: now + idle
    assert ((await client.get("/admin/projects")).status_code == 303) is expired


async def test_a_busy_session_still_ends_after_twelve_hours(
    client: httpx.AsyncClient, ctx: Context, admin: str
) -> None:
    await signed_in_csrf(client)
    start = ctx.clock()
    for minutes in range(20, 12 * 60, 20):  # active every 20 minutes: never idle
        ctx.clock = lambda minutes=minutes: start + timedelta(minutes=minutes)  # type: ignore[misc]
        assert (await client.get("/admin/projects")).status_code == 200
    ctx.clock = lambda: start + timedelta(hours=12, minutes=1)
    assert (await client.get("/admin/projects")).status_code == 303


async def test_repeated_failed_sign_ins_have_to_wait(client: httpx.AsyncClient, admin: str) -> None:
    statuses = [(await sign_in(client, "wrong password!")).status_code for _ in range(7)]
    assert statuses[:6] == [401] * 6
    assert statuses[6] == 429
    assert (await sign_in(client)).status_code == 429  # even the right password waits its turn


async def test_cookies_are_httponly_strict_and_host_bound_over_https(client: httpx.AsyncClient, admin: str) -> None:
    client.base_url = httpx.URL("https://credgate.test")
    response = await sign_in(client)
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("__Host-credgate_session=")
    assert all(flag in cookie for flag in ("HttpOnly", "Secure", "Path=/", "SameSite=strict"))


async def test_every_panel_page_carries_the_security_headers(client: httpx.AsyncClient, admin: str) -> None:
    for path in ("/admin/login", "/admin/static/panel.css", "/admin/nowhere"):
        headers = (await client.get(path)).headers
        policy = headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy
        assert "unsafe-inline" not in policy
        assert headers["x-content-type-options"] == "nosniff"


async def test_no_page_ever_holds_a_stored_key(client: httpx.AsyncClient, ctx: Context, admin: str) -> None:
    SWEEP.register(KEY)
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="openai", template_id="openai-chat-completions", api_key=KEY, actor="t"
    )
    await signed_in_csrf(client)
    base = f"/admin/projects/{project.id}"
    pages = ["/admin/projects", base, f"{base}/usage", f"{base}/add?provider=openai", "/admin/audit"]
    pages += [f"{base}/integrations/openai{suffix}" for suffix in ("", "/endpoints", "/key", "/key?mode=rotate")]
    for path in pages:
        response = await client.get(path)
        assert response.status_code == 200, path
        assert KEY not in response.text, path
        assert KEY[-12:] not in response.text, path
