"""Single sign-on in Chromium against a real `credgate serve`: the provider on another site (localhost, the
gateway on 127.0.0.1), so the browser applies its SameSite rules as it would with a real provider. The flow's
state cookie (Lax) must come back on the provider's redirect, and the panel's session cookie (Strict) must be
sent on the page after the callback; the user was added by the CLI for single sign-on."""

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from playwright.async_api import Page

from tests.browser.conftest import screenshot, seen
from tests.e2e.conftest import RunningGateway, start_gateway, stop_gateway
from tests.oidc_provider import CLIENT_ID, CLIENT_SECRET, OidcProvider, run_oidc_provider
from tests.secret_sweep import SWEEP

EMAIL = "alice@example.com"


@pytest.fixture
async def provider() -> AsyncIterator[OidcProvider]:
    SWEEP.register(CLIENT_SECRET)
    async with run_oidc_provider(host="localhost") as running:
        running.consent_page = True
        yield running


@pytest.fixture
def sso_gateway(provider: OidcProvider, tmp_path: Path) -> Iterator[RunningGateway]:
    settings = {
        "CREDGATE_OIDC_ISSUER": provider.url,
        "CREDGATE_OIDC_CLIENT_ID": CLIENT_ID,
        "CREDGATE_OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "CREDGATE_OIDC_NAME": "Example SSO",
    }
    process, gateway = start_gateway(tmp_path / "data", tmp_path / "gateway.log", settings)
    try:
        yield gateway
    finally:
        stop_gateway(process, gateway)
        SWEEP.scan_file(gateway.log, SWEEP.secrets)


async def test_an_admin_signs_in_through_the_provider_and_lands_on_the_projects(
    sso_gateway: RunningGateway, provider: OidcProvider, page: Page, tmp_path: Path
) -> None:
    added = sso_gateway.cli("admin", "create-user", EMAIL, "--single-sign-on", "--role", "viewer")
    assert added.returncode == 0, added.stderr
    both = sso_gateway.cli("admin", "create-user", "x", "--single-sign-on", "--password-stdin", stdin="p" * 12)
    assert both.returncode != 0
    assert "give one of --password-stdin and --single-sign-on" in both.stderr

    await page.goto(f"{sso_gateway.url}/admin/login")
    await screenshot(page, "sign-in-with-sso", tmp_path)
    await page.get_by_role("link", name="Sign in with Example SSO").click()
    await page.get_by_role("link", name="Continue").click()  # on the provider's site
    await page.wait_for_url(f"{sso_gateway.url}/admin/projects")

    html = await seen(page)
    assert EMAIL in html  # the session cookie came with the page after the provider's redirect
    assert provider.authorize_requests[0]["code_challenge_method"] == "S256"
    assert provider.refusals == []
    cookies = {cookie["name"]: cookie for cookie in await page.context.cookies()}
    assert cookies["credgate_session"]["sameSite"] == "Strict"
    assert "credgate_sso" not in cookies  # the flow's state is gone once used
    log = sso_gateway.log.read_text()
    assert CLIENT_SECRET not in log
    assert provider.token_requests[0]["code"] not in log
