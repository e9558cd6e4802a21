"""Single sign-on to the panel against a stand-in OpenID Connect provider on a real socket: Authorization Code
with PKCE and a nonce, users matched by the provider's subject, password users never taken over, and every
wrong answer refused without a session. The browser's side (SameSite cookies across the redirects) is in
tests/browser/test_single_sign_on.py."""

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from credgate.admin_ui import sso_pages
from credgate.app import create_app
from credgate.config import Settings
from credgate.services import admins, projects
from credgate.services.bootstrap import open_context
from credgate.services.context import Context, utcnow
from tests.admin_ui.test_security import PASSWORD, csrf_of
from tests.oidc_provider import CLIENT_ID, CLIENT_SECRET, Account, OidcProvider, run_oidc_provider
from tests.secret_sweep import SWEEP

EMAIL = "alice@example.com"


@pytest.fixture
def backend() -> str:
    return "sqlite"  # what is tested here is the panel's, not the database's


@pytest.fixture
async def provider() -> AsyncIterator[OidcProvider]:
    SWEEP.register(CLIENT_SECRET)
    async with run_oidc_provider() as running:
        yield running


def sso_settings(settings: Settings, provider: OidcProvider, **changes: object) -> Settings:
    values = {
        "oidc_issuer": provider.url,
        "oidc_client_id": CLIENT_ID,
        "oidc_client_secret": CLIENT_SECRET,
        "oidc_name": "Example SSO",
    }
    return Settings.model_validate(settings.model_dump() | values | changes)


@pytest.fixture
async def panel(settings: Settings, ctx: Context, provider: OidcProvider) -> AsyncIterator[httpx.AsyncClient]:
    """The panel in process, with single sign-on through `provider`."""
    app = create_app(sso_settings(settings, provider), context=ctx)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://credgate.test") as client:
        yield client


async def through_provider(panel: httpx.AsyncClient, provider: OidcProvider, start_at: str = "/admin/sso/start") -> str:
    """Start the sign-in and let the provider answer: the callback address the browser is sent back to."""
    start = await panel.get(start_at)
    assert start.status_code == 302, start.text
    assert start.headers["location"].startswith(f"{provider.url}/authorize?")
    async with httpx.AsyncClient() as browser:
        answer = await browser.get(start.headers["location"])
    assert answer.status_code == 302, answer.text
    callback = answer.headers["location"]
    assert callback.startswith("http://credgate.test/admin/sso/callback?")
    return callback


async def sign_in(panel: httpx.AsyncClient, provider: OidcProvider) -> httpx.Response:
    return await panel.get(await through_provider(panel, provider))


async def test_a_user_added_for_single_sign_on_signs_in_with_pkce_and_keeps_its_role(
    panel: httpx.AsyncClient, provider: OidcProvider, ctx: Context
) -> None:
    project, _ = await projects.create_project(ctx, name="granted", actor="t")
    await projects.create_project(ctx, name="not-granted", actor="t")
    await admins.create_admin_user(
        ctx, username=EMAIL, password=None, actor="t", role="project_admin", project_ids=[project.id]
    )
    login = await panel.get("/admin/login")
    assert 'href="/admin/sso/start">Sign in with Example SSO</a>' in login.text

    done = await sign_in(panel, provider)

    assert done.status_code == 200
    assert 'http-equiv="refresh" content="0;url=/admin/projects"' in done.text
    cookie = done.headers["set-cookie"]
    assert "credgate_session=" in cookie
    assert "samesite=strict" in cookie.lower()
    assert "httponly" in cookie.lower()
    page = await panel.get("/admin/projects")
    assert page.status_code == 200
    assert EMAIL in page.text
    assert "granted" in page.text
    assert "not-granted" not in page.text
    # PKCE (S256) and a nonce went out; the verifier came back to the token endpoint with the client's secret.
    sent = provider.authorize_requests[0]
    assert (sent["code_challenge_method"], sent["response_type"], sent["client_id"]) == ("S256", "code", CLIENT_ID)
    assert sent["nonce"]
    assert sent["state"]
    assert "openid" in sent["scope"].split()
    assert provider.token_requests[0]["code_verifier"]
    assert provider.refusals == []
    async with ctx.database.transaction(write=False) as repo:
        user = await repo.find_admin_user(EMAIL)
        events = [(event.action, event.actor) for event in await repo.list_audit_events(limit=5)]
    assert user is not None
    assert user.oidc_subject == f"{provider.url} idp-user-1"
    assert ("admin_user.single_sign_on", f"sso:{EMAIL}") in events
    assert ("panel.sign_in", f"user:{EMAIL}") in events


async def stale_session(
    panel: httpx.AsyncClient, provider: OidcProvider, ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str]:
    """A single sign-on user signed in 16 minutes ago: their CSRF token, and the confirmation page's link."""
    await admins.create_admin_user(ctx, username=EMAIL, password=None, actor="t")
    start = utcnow()
    monkeypatch.setattr(ctx, "clock", lambda: start)
    assert (await sign_in(panel, provider)).status_code == 200
    monkeypatch.setattr(ctx, "clock", lambda: start + timedelta(minutes=16))
    csrf = csrf_of((await panel.get("/admin/projects")).text)
    refused = await panel.post("/admin/projects", data={"csrf": csrf, "name": "new"})
    assert (refused.status_code, refused.headers["location"]) == (303, "/admin/confirm?next=%2Fadmin%2Fprojects")
    confirm = await panel.get(refused.headers["location"])
    link = "/admin/sso/start?confirm=1&amp;next=%2Fadmin%2Fprojects"
    assert f'href="{link}">Sign in again with Example SSO</a>' in confirm.text
    assert 'name="password"' not in confirm.text
    return csrf, link.replace("&amp;", "&")


async def test_a_single_sign_on_user_confirms_who_they_are_by_signing_in_at_the_provider_again(
    panel: httpx.AsyncClient, provider: OidcProvider, ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sensitive change (here a new project, which hands out its token) needs a sign-in within 15 minutes; for
    a user without a password, that is one at the provider, asked not to rely on its own session."""
    csrf, link = await stale_session(panel, provider, ctx, monkeypatch)
    by_password = await panel.post("/admin/confirm", data={"csrf": csrf, "next": "/admin/projects", "password": ""})
    assert by_password.status_code == 401  # no password to give

    done = await panel.get(await through_provider(panel, provider, link))
    assert done.status_code == 200
    assert 'http-equiv="refresh" content="0;url=/admin/projects"' in done.text
    assert "credgate_session" not in done.headers.get("set-cookie", "")  # the session confirmed is the one held
    assert "prompt" not in provider.authorize_requests[0]
    assert (provider.authorize_requests[1]["prompt"], provider.authorize_requests[1]["max_age"]) == ("login", "0")
    made = await panel.post("/admin/projects", data={"csrf": csrf, "name": "new"})
    assert made.status_code == 303
    assert made.headers["location"].startswith("/admin/projects/prj_")
    async with ctx.database.transaction(write=False) as repo:
        actions = [(event.action, event.detail) for event in await repo.list_audit_events(limit=5)]
    assert ("panel.confirm", {"via": "single sign-on"}) in actions


async def test_a_provider_that_keeps_its_own_session_confirms_nothing(
    panel: httpx.AsyncClient, provider: OidcProvider, ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`prompt` and `max_age` travel in the browser's address, where they can be removed, and a provider may
    ignore them: the ID token's `auth_time` must say the user signed in after the confirmation started."""
    csrf, link = await stale_session(panel, provider, ctx, monkeypatch)
    provider.misbehave, provider.signed_in_at = "keeps-its-session", time.time() - 3600
    refused = await panel.get(await through_provider(panel, provider, link))
    assert refused.status_code == 403
    assert "did not sign you in again" in refused.text
    again = await panel.post("/admin/projects", data={"csrf": csrf, "name": "new"})
    assert again.headers["location"].startswith("/admin/confirm?")


async def test_a_sign_in_through_the_providers_own_session_is_as_recent_as_that_session(
    panel: httpx.AsyncClient, provider: OidcProvider, ctx: Context
) -> None:
    """Whoever sits at a screen where the provider's session is open signs in without a password: what they may
    hand out or take away depends on when the account last did type it."""
    await admins.create_admin_user(ctx, username=EMAIL, password=None, actor="t")
    provider.signed_in_at = time.time() - 3600
    assert (await sign_in(panel, provider)).status_code == 200
    csrf = csrf_of((await panel.get("/admin/projects")).text)
    asked = await panel.post("/admin/projects", data={"csrf": csrf, "name": "new"})
    assert asked.headers["location"].startswith("/admin/confirm?")
    provider.signed_in_at = time.time()
    assert (await sign_in(panel, provider)).status_code == 200
    csrf = csrf_of((await panel.get("/admin/projects")).text)
    made = await panel.post("/admin/projects", data={"csrf": csrf, "name": "new"})
    assert made.headers["location"].startswith("/admin/projects/prj_")


async def test_the_user_is_known_by_subject_so_a_reassigned_address_reaches_nobody_else(
    panel: httpx.AsyncClient, provider: OidcProvider, ctx: Context
) -> None:
    await admins.create_admin_user(ctx, username=EMAIL, password=None, actor="t", role="viewer")
    assert (await sign_in(panel, provider)).status_code == 200
    panel.cookies.clear()
    assert (await sign_in(panel, provider)).status_code == 200  # again, found by its subject
    panel.cookies.clear()
    provider.account.sub = "idp-user-2"  # the provider gave the address to someone else

    refused = await sign_in(panel, provider)

    assert refused.status_code == 403
    assert "signs in another way" in refused.text
    assert "credgate_session" not in refused.headers.get("set-cookie", "")


async def test_a_password_user_is_never_taken_over_and_a_single_sign_on_user_has_no_password(
    panel: httpx.AsyncClient, provider: OidcProvider, ctx: Context
) -> None:
    await admins.create_admin_user(ctx, username=EMAIL, password=PASSWORD, actor="t")
    await admins.create_admin_user(ctx, username="bob@example.com", password=None, actor="t")

    refused = await sign_in(panel, provider)

    assert refused.status_code == 403
    assert "signs in another way" in refused.text
    for password in ("", PASSWORD):
        login = await panel.get("/admin/login")
        csrf = login.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        tried = await panel.post(
            "/admin/login", data={"csrf": csrf, "username": "bob@example.com", "password": password}
        )
        assert tried.status_code == 401


async def test_someone_the_panel_does_not_know_is_refused_with_the_owners_command(
    panel: httpx.AsyncClient, provider: OidcProvider, ctx: Context
) -> None:
    refused = await sign_in(panel, provider)

    assert refused.status_code == 403
    assert f"credgate admin create-user {EMAIL} --single-sign-on --role viewer" in refused.text
    async with ctx.database.transaction(write=False) as repo:
        assert await repo.count_admin_users() == 0


async def test_new_users_of_the_listed_domains_may_be_made_viewers_who_change_nothing(
    settings: Settings, ctx: Context, provider: OidcProvider
) -> None:
    changes = {"oidc_new_users": "viewer", "oidc_email_domains": "Example.com, example.org"}
    app = create_app(sso_settings(settings, provider, **changes), context=ctx)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://credgate.test") as panel:
        provider.account = Account(sub="idp-user-9", email="mallory@elsewhere.example")
        outsider = await sign_in(panel, provider)
        assert outsider.status_code == 403
        assert "this panel has no user mallory@elsewhere.example" in outsider.text
        provider.account = Account(email="Alice@EXAMPLE.com")  # compared in lower case
        assert (await sign_in(panel, provider)).status_code == 200
        page = await panel.get("/admin/projects")
        csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        assert (await panel.post("/admin/projects", data={"csrf": csrf, "name": "x"})).status_code == 403
    async with ctx.database.transaction(write=False) as repo:
        user = await repo.find_admin_user(EMAIL)
        assert await repo.count_admin_users() == 1
    assert user is not None
    assert (user.role, user.password_hash) == ("viewer", "")


async def test_two_tabs_and_two_first_sign_ins_at_once_all_succeed(
    panel: httpx.AsyncClient, provider: OidcProvider, ctx: Context
) -> None:
    """A second sign-in started in another tab does not spoil the first, and the same person's two first
    sign-ins finishing together both open a session (one binds the user, the other finds it bound)."""
    await admins.create_admin_user(ctx, username="Alice@Example.com", password=None, actor="t", role="viewer")
    first, second = await through_provider(panel, provider), await through_provider(panel, provider)

    done = await asyncio.gather(panel.get(first), panel.get(second))

    assert [response.status_code for response in done] == [200, 200]
    async with ctx.database.transaction(write=False) as repo:
        assert await repo.count_admin_users() == 1


async def test_a_flow_older_than_ten_minutes_or_a_link_with_any_error_text_is_refused(
    panel: httpx.AsyncClient, provider: OidcProvider, ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    await admins.create_admin_user(ctx, username=EMAIL, password=None, actor="t", role="viewer")
    callback = await through_provider(panel, provider)
    state = parse_qs(urlsplit(callback).query)["state"][0]
    forged = f"/admin/sso/callback?error=Your+account+is+locked.+Call+555&state={state}"
    shown = await panel.get(forged)
    assert shown.status_code == 403
    assert "locked" not in shown.text
    assert "answer was refused" in shown.text
    unknown = await panel.get("/admin/sso/callback?error=Your+account+is+locked&state=guessed")
    assert "locked" not in unknown.text
    assert "started in another browser" in unknown.text

    callback = await through_provider(panel, provider)
    later = sso_pages._now() + 601
    monkeypatch.setattr(sso_pages, "_now", lambda: later)
    stale = await panel.get(callback)

    assert stale.status_code == 403
    assert "took too long" in stale.text


async def test_the_callback_may_reach_another_instance(
    settings: Settings, ctx: Context, provider: OidcProvider, panel: httpx.AsyncClient
) -> None:
    """The flow's state travels in the sealed cookie: an instance that never saw the start completes it."""
    await admins.create_admin_user(ctx, username=EMAIL, password=None, actor="t", role="viewer")
    callback = await through_provider(panel, provider)
    other_ctx = await open_context(settings)  # the same database and master key, nothing else shared
    try:
        app = create_app(sso_settings(settings, provider), context=other_ctx)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://credgate.test") as other:
            other.cookies = panel.cookies
            assert (await other.get(callback)).status_code == 200
            assert EMAIL in (await other.get("/admin/projects")).text
    finally:
        await other_ctx.database.dispose()


@pytest.mark.parametrize(
    ("misbehave", "reason"),
    [
        ("wrong-nonce", "answer was refused"),
        ("wrong-audience", "answer was refused"),
        ("audience-only-in-azp", "answer was refused"),
        ("expired", "answer was refused"),
        ("foreign-key", "answer was refused"),
        ("deny", "answered access_denied"),
        ("unverified-email", "no verified email address"),
        ("replayed-code", "answered invalid_grant"),
        ("no-state-cookie", "started in another browser"),
        ("altered-state-cookie", "started in another browser"),
        ("other-state", "started in another browser"),
    ],
)
async def test_every_wrong_answer_is_refused_without_a_session(
    panel: httpx.AsyncClient, provider: OidcProvider, ctx: Context, misbehave: str, reason: str
) -> None:
    await admins.create_admin_user(ctx, username=EMAIL, password=None, actor="t", role="owner")
    provider.misbehave = misbehave
    provider.account.email_verified = misbehave != "unverified-email"
    callback = await through_provider(panel, provider)
    if misbehave == "replayed-code":
        assert (await panel.get(callback)).status_code == 200
        panel.cookies.clear()
        start = await panel.get("/admin/sso/start")  # a fresh flow, with the old code
        assert start.status_code == 302
        callback = callback.replace(
            parse_qs(urlsplit(callback).query)["state"][0],
            parse_qs(urlsplit(start.headers["location"]).query)["state"][0],
        )
    elif misbehave == "no-state-cookie":
        panel.cookies.clear()
    elif misbehave == "altered-state-cookie":
        [(name, sealed)] = panel.cookies.items()
        panel.cookies.clear()
        panel.cookies.set(name, sealed[:-6] + ("AAAAAA" if sealed[-6:] != "AAAAAA" else "BBBBBB"))
    elif misbehave == "other-state":
        callback = callback.replace("state=", "state=x")

    refused = await panel.get(callback)

    assert refused.status_code == 403
    assert reason in refused.text
    assert "credgate_session" not in refused.headers.get("set-cookie", "")
    assert (await panel.get("/admin/projects")).status_code == 303


@pytest.mark.parametrize(
    ("misbehave", "reason"),
    [
        ("other-issuer", "names another issuer"),
        ("not-json-discovery", "answer was refused"),
        ("discovery-without-endpoints", "answer was refused"),
    ],
)
async def test_a_discovery_document_that_is_wrong_or_not_one_is_refused_then_read_again(
    panel: httpx.AsyncClient, provider: OidcProvider, misbehave: str, reason: str
) -> None:
    provider.misbehave = misbehave
    refused = await panel.get("/admin/sso/start")
    assert refused.status_code == 403
    assert reason in refused.text
    provider.misbehave = ""  # mended at the provider: the next sign-in reads the document again
    assert (await panel.get("/admin/sso/start")).status_code == 302


async def test_without_single_sign_on_set_up_there_is_no_button_and_no_route(
    client: httpx.AsyncClient, ctx: Context
) -> None:
    assert "Sign in with" not in (await client.get("/admin/login")).text
    assert (await client.get("/admin/sso/start")).status_code == 404
    assert (await client.get("/admin/sso/callback?code=x&state=y")).status_code == 404


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"oidc_issuer": "https://idp.example"}, "needs both"),
        ({"oidc_client_id": "x"}, "needs both"),
        ({"oidc_issuer": "http://idp.example", "oidc_client_id": "x"}, "must be an https:// URL"),
        ({"oidc_issuer": "https://idp.example", "oidc_client_id": "x", "oidc_new_users": "viewer"}, "EMAIL_DOMAINS"),
    ],
)
def test_settings_refuse_half_a_provider_or_plain_http_off_this_machine(values: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings.model_validate(values)
