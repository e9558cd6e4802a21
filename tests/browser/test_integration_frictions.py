"""The integration pages where the browser matters: its Back button from the review of Add new API, and the auth
fields that follow the chosen method, without script too. One gateway serves the module."""

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, seen, sign_in
from tests.e2e.conftest import RunningGateway, start_gateway, stop_gateway
from tests.secret_sweep import SWEEP

# One pytest-xdist worker runs this module, so its module-scoped gateway starts once per run.
pytestmark = pytest.mark.xdist_group("browser_frictions")
KEY = "sk-ant-test-browser-back-key-00001234"
CUSTOM_KEY = "custom-browser-preview-key-0000wxyz"
for _key in (KEY, CUSTOM_KEY):
    SWEEP.register(_key)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """A real `credgate serve` with the admin `admin`, shared by this module's tests."""
    folder: Path = tmp_path_factory.mktemp("frictions")
    process, running = start_gateway(folder / "data", folder / "gateway.log")
    try:
        assert running.cli("admin", "create-user", "admin", "--password-stdin", stdin=PASSWORD).returncode == 0
        yield running
    finally:
        stop_gateway(process, running)


async def new_project(page: Page, gateway: RunningGateway, name: str) -> str:
    await page.goto(f"{gateway.url}/admin/projects")
    await page.get_by_label("Name").fill(name)
    await page.get_by_role("button", name="Create project").click()
    await expect(page.locator("#new-secret")).to_be_visible()
    return page.url


async def expect_as_entered(page: Page) -> None:
    await expect(page.get_by_label("Name in proxy paths")).to_have_value("claude")
    await expect(page.get_by_label(re.compile("^Base URL"))).to_have_value("https://claude.example.com")
    await expect(page.get_by_label(re.compile("Models"))).to_be_checked()
    await expect(page.locator(".key-kept")).to_contain_text("A key was entered (ends …1234)")
    assert KEY not in await seen(page)


async def test_back_from_the_review_finds_the_form_as_entered(gateway: RunningGateway, page: Page) -> None:
    """The review's Back link (a new visit, which the browser does not fill in) and the browser's Back button."""
    await sign_in(page, gateway)
    project_url = await new_project(page, gateway, "Returning")
    await page.goto(f"{project_url}/add?provider=anthropic")
    await page.get_by_label("Name in proxy paths").fill("claude")
    await page.get_by_label("anthropic API key").fill(KEY)
    await page.get_by_label(re.compile("^Base URL")).fill("https://claude.example.com")
    await page.get_by_label(re.compile("Models")).check()
    await page.get_by_role("button", name="Review").click()
    await expect(page.locator(".summary")).to_contain_text("…1234")

    await page.get_by_role("link", name="Back", exact=True).click()
    await expect_as_entered(page)
    await page.get_by_role("button", name="Review").click()  # the key field left empty: the kept key
    await expect(page.locator(".summary")).to_contain_text("…1234")
    await page.go_back()
    await expect_as_entered(page)
    await page.get_by_role("button", name="Review").click()
    await expect(page.locator(".summary")).to_contain_text("https://claude.example.com")
    await page.get_by_role("button", name="Save").click()
    await expect(page.get_by_role("status").first).to_contain_text("claude set up.")
    assert KEY not in await seen(page)


FIELDS = ("Header or parameter name", "Prefix before the key", "Token URL", "Client ID", "Audience")
SHOWN = {
    "bearer": set(),
    "header": {"Header or parameter name", "Prefix before the key"},
    "oauth2_refresh_token": {"Token URL", "Client ID"},
    "oauth2_client_credentials": {"Token URL", "Client ID", "Audience"},
}


async def test_only_the_chosen_methods_fields_show_without_script_and_the_header_is_previewed(
    gateway: RunningGateway, browser: Browser
) -> None:
    for script in (False, True):
        context = await browser.new_context(java_script_enabled=script)
        page = await context.new_page()
        await sign_in(page, gateway)
        project_url = await new_project(page, gateway, f"Methods {script}")
        await page.goto(f"{project_url}/custom")
        for method, shown in SHOWN.items():
            await page.get_by_label("How the key is sent").select_option(method)
            for label in FIELDS:
                field = page.get_by_label(label)
                await (expect(field).to_be_visible() if label in shown else expect(field).to_be_hidden())
        if script:  # the preview follows what is typed
            await page.get_by_label("How the key is sent").select_option("header")
            await page.get_by_label("Header or parameter name").fill("Authorization")
            await page.get_by_label("Prefix before the key").fill("Bearer")
            await page.get_by_label("API key").fill(CUSTOM_KEY)
            await expect(page.locator("#auth_preview")).to_contain_text("Authorization: Bearer …wxyz")
            assert CUSTOM_KEY not in await seen(page)
        await context.close()
