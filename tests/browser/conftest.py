"""Browser fixtures: Debian's Chromium driven by Playwright against a real `credgate serve` and the stand-in
upstream. Every page a test sees goes through the secret sweep. Set CREDGATE_TEST_SCREENSHOTS=docs/screenshots to
refresh the README's screenshots."""

import os
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright

from credgate.config import Settings
from credgate.services import admins
from credgate.services.bootstrap import open_context
from tests.e2e.conftest import RunningGateway, start_gateway, stop_gateway
from tests.secret_sweep import SWEEP
from tests.upstream import Upstream, run_upstream

CHROMIUM = os.environ.get("CREDGATE_TEST_CHROMIUM", "/usr/bin/chromium")
# Chromium's background services would try the network, which this machine does not have.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _require_chromium() -> None:
    if not shutil.which(CHROMIUM):
        if os.environ.get("CREDGATE_TEST_NO_SKIPS") == "1":
            pytest.fail(f"browser tests need Chromium at {CHROMIUM} (.ci/run installs Debian's chromium)")
        pytest.skip(f"browser tests need Chromium at {CHROMIUM}: apt-get install chromium")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[RunningGateway, str]]:
    """A real `credgate serve` with no admin yet, and the one-time setup link it printed."""
    process, gateway = start_gateway(tmp_path / "data", tmp_path / "gateway.log")
    try:
        match = re.search(r"(http://\S+/admin/setup\?token=\S+)", gateway.log.read_text())
        assert match is not None, "serve printed no setup link"
        yield gateway, match.group(1)
    finally:
        stop_gateway(process, gateway)


@pytest.fixture
async def gateway(served: tuple[RunningGateway, str]) -> RunningGateway:
    """The served gateway with an owner `admin`, made beside it through a context of its own on the same data dir,
    as the CLI would (tests/test_cli.py runs the command; a process for it here cost a CPU second a test)."""
    running = served[0]
    ctx = await open_context(Settings(data_dir=Path(running.env["CREDGATE_DATA_DIR"])))
    try:
        await admins.create_admin_user(ctx, username="admin", password=PASSWORD, actor="browser tests")
    finally:
        await ctx.close()
    return running


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    async with run_upstream() as running:
        yield running


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1200, "height": 900})
    opened = await context.new_page()
    yield opened
    await context.close()


async def seen(page: Page) -> str:
    """The page's HTML, recorded for the secret sweep."""
    html = await page.content()
    SWEEP.capture(f"page {page.url}", html)
    return html


async def sign_in(page: Page, gateway: RunningGateway, username: str = "admin", password: str = PASSWORD) -> None:
    await page.goto(f"{gateway.url}/admin/login")
    await page.get_by_label("Username").fill(username)
    await page.get_by_label("Password").fill(password)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_load_state()
    await seen(page)


async def screenshot(page: Page, name: str, tmp_path: Path) -> None:
    """Into tmp_path, or into CREDGATE_TEST_SCREENSHOTS when set (which must exist)."""
    folder = os.environ.get("CREDGATE_TEST_SCREENSHOTS", str(tmp_path))
    await page.screenshot(path=f"{folder}/{name}.png", full_page=True)
