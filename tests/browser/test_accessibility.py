"""The panel's accessibility and small screens in Chromium, against one served gateway for the whole module:
axe-core (from npm, tests/browser/package.json) finds no serious or critical violation on any main page, no page
scrolls sideways on a 390 px phone (nor on a desktop, with names too long for one line), the keyboard reaches the
content first through a skip link and sees where it is, and the charts' day labels stay inside their chart."""

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, ViewportSize

from tests.browser.conftest import PASSWORD, screenshot, seen, sign_in
from tests.e2e.conftest import RunningGateway, start_gateway, stop_gateway
from tests.secret_sweep import SWEEP

# One pytest-xdist worker runs this module, so its module-scoped gateway starts once per run.
pytestmark = pytest.mark.xdist_group("accessibility")
AXE = Path(__file__).parent / "node_modules" / "axe-core" / "axe.min.js"
KEY = "sk-test-panel-a11y-first-key-0000uvwx"
REVIEW_KEY = "sk-ant-test-panel-a11y-review-000yz"
SWEEP.register(KEY)
SWEEP.register(REVIEW_KEY)
LONG_PROJECT = "Unbroken" * 25  # the longest name allowed (200 characters), without a space
LONG_PROVIDER = "a-provider-whose-name-is-as-long-as-a-dns-label-may-be-0123456"  # 63 characters
CLOSED_PORT = "http://127.0.0.1:9/v1"  # nothing listens: a call fails at once
PHONE: ViewportSize = {"width": 390, "height": 844}
DESKTOP: ViewportSize = {"width": 1200, "height": 900}
# The pages the README shows, by the name of their picture in docs/screenshots (CREDGATE_TEST_SCREENSHOTS).
SCREENSHOTS = {
    "integration": "integration",
    "keys": "key-pool",
    "budgets": "budgets",
    "webhooks": "webhooks",
    "admins": "admins",
}


@pytest.fixture
def axe_script() -> Path:
    """axe.min.js as `npm ci --prefix tests/browser` installs it; in CI its absence fails the test."""
    if not AXE.is_file():
        reason = f"the accessibility check needs {AXE}: run `npm ci --prefix tests/browser` (.ci/run does)"
        if os.environ.get("CI") or os.environ.get("CREDGATE_TEST_NO_SKIPS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return AXE


@dataclass(frozen=True)
class Site:
    """The served gateway (whose admin is `admin`) and its two projects."""

    gateway: RunningGateway
    project_id: str
    long_project_id: str

    def pages(self) -> dict[str, str]:
        """The main pages, by name, as paths (signed in)."""
        project = f"/admin/projects/{self.project_id}"
        openai = f"{project}/integrations/openai"
        return {
            "projects": "/admin/projects",
            "project": project,
            "project with long names": f"/admin/projects/{self.long_project_id}",
            "integration": openai,
            "integration with a long name": f"/admin/projects/{self.long_project_id}/integrations/{LONG_PROVIDER}",
            "keys": f"{openai}/keys",
            "keys with a long name": f"/admin/projects/{self.long_project_id}/integrations/{LONG_PROVIDER}/keys",
            "key": f"{openai}/key?mode=rotate",
            "endpoints": f"{openai}/endpoints",
            "prices": f"{openai}/prices",
            "usage": f"{project}/usage",
            "usage of long names": f"/admin/projects/{self.long_project_id}/usage",
            "budgets": f"{project}/budgets",
            "webhooks": f"{project}/webhooks",
            "audit": "/admin/audit",
            "admins": "/admin/admins",
            "add new API": f"{project}/add",
            "add new API: details": f"{project}/add?provider=anthropic",
            "custom configure": f"{project}/custom",
            "revoke the project token": f"{project}/token/revoke",
            "confirm it's you": f"/admin/confirm?next={openai}/key",
            "error": "/admin/projects/nowhere",
        }


def _created(response: httpx.Response) -> Any:
    assert response.status_code in (200, 201, 202), response.text
    return response.json()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """One `credgate serve` for the module: an admin, a project with OpenAI's chat template (pointed at a closed
    port: its calls fail, and fill the usage page), a budget and a webhook; and a project whose name and whose
    integration's name are as long as allowed, unbroken. Made through the admin API: quicker than a CLI each."""
    folder = tmp_path_factory.mktemp("accessibility")
    process, gateway = start_gateway(folder / "data", folder / "gateway.log")
    try:
        assert gateway.cli("admin", "create-user", "admin", "--password-stdin", stdin=PASSWORD).returncode == 0
        admin_token = gateway.cli("admin", "create-token").stdout.strip().split()[-1]
        with httpx.Client(base_url=f"{gateway.url}/api/v1", headers={"Authorization": f"Bearer {admin_token}"}) as api:
            created = _created(api.post("/projects", json={"name": "My app"}))
            project_id, token = created["project"]["id"], created["secret"]
            openai = {"provider": "openai", "template": "openai-chat-completions", "api_key": KEY}
            _created(api.post(f"/projects/{project_id}/integrations", json=openai | {"base_url": CLOSED_PORT}))
            for _ in range(2):
                call = httpx.post(
                    f"{gateway.url}/proxy/openai/chat/completions",
                    json={},
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert call.status_code >= 500
            budget = {"metric": "requests", "limit": 1000, "period": "day"}
            _created(api.post(f"/projects/{project_id}/budgets", json=budget))
            _created(api.post(f"/projects/{project_id}/webhooks", json={"url": f"{CLOSED_PORT}/hooks/credgate"}))
            long_id = _created(api.post("/projects", json={"name": LONG_PROJECT}))["project"]["id"]
            custom = {"provider": LONG_PROVIDER, "base_url": CLOSED_PORT, "api_key": KEY}
            _created(api.post(f"/projects/{long_id}/integrations", json=custom))
        yield Site(gateway=gateway, project_id=project_id, long_project_id=long_id)
    finally:
        stop_gateway(process, gateway)


@pytest.fixture
async def tab(browser: Browser) -> AsyncIterator[Page]:
    """A page whose scripts may be added by the test (axe is injected; the panel's CSP allows no inline script)."""
    context = await browser.new_context(viewport=DESKTOP, bypass_csp=True)
    opened = await context.new_page()
    yield opened
    await context.close()


async def _serious_violations(page: Page, axe: Path) -> list[str]:
    """axe's serious and critical violations on the page: rule id, what it asks, and the elements' selectors."""
    await page.add_script_tag(path=str(axe))
    results = await page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    return [
        f"{violation['id']} ({violation['impact']}: {violation['help']}) at "
        + ", ".join(" ".join(node["target"]) for node in violation["nodes"])
        for violation in results["violations"]
        if violation["impact"] in ("serious", "critical")
    ]


async def _review_page(page: Page, site: Site) -> None:
    """The add-new-API flow's last step: details filled in, not saved."""
    await page.goto(f"{site.gateway.url}/admin/projects/{site.project_id}/add?provider=anthropic")
    await page.get_by_label("anthropic API key").fill(REVIEW_KEY)
    await page.get_by_role("button", name="Review").click()
    await page.wait_for_load_state()


async def _sideways(page: Page) -> int:
    """How far the page scrolls sideways (0: not at all)."""
    width: int = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    return width


async def test_no_main_page_has_a_serious_or_critical_axe_violation(
    site: Site, tab: Page, axe_script: Path, tmp_path: Path
) -> None:
    found: dict[str, list[str]] = {}
    await tab.goto(f"{site.gateway.url}/admin/login")
    found["sign-in"] = await _serious_violations(tab, axe_script)
    await sign_in(tab, site.gateway)
    for name, path in site.pages().items():
        await tab.goto(f"{site.gateway.url}{path}")
        await seen(tab)
        if name in SCREENSHOTS:
            await screenshot(tab, SCREENSHOTS[name], tmp_path)
        found[name] = await _serious_violations(tab, axe_script)
    await _review_page(tab, site)
    assert REVIEW_KEY not in await seen(tab)
    found["add new API: review"] = await _serious_violations(tab, axe_script)
    failing = {name: violations for name, violations in found.items() if violations}
    assert not failing, "axe found serious or critical violations:\n" + "\n".join(
        f"{name}: {violation}" for name, violations in failing.items() for violation in violations
    )


async def test_no_main_page_scrolls_sideways_on_a_phone_nor_with_long_names_on_a_desktop(site: Site, tab: Page) -> None:
    found: dict[str, int] = {}
    await tab.set_viewport_size(PHONE)
    await tab.goto(f"{site.gateway.url}/admin/login")
    found["sign-in"] = await _sideways(tab)
    await sign_in(tab, site.gateway)
    for name, path in site.pages().items():
        await tab.goto(f"{site.gateway.url}{path}")
        for size, viewport in (("390 px", PHONE), ("desktop", DESKTOP)):
            await tab.set_viewport_size(viewport)
            found[f"{name} ({size})"] = await _sideways(tab)
        await tab.set_viewport_size(PHONE)
    await _review_page(tab, site)
    found["add new API: review (390 px)"] = await _sideways(tab)
    wider = {name: pixels for name, pixels in found.items() if pixels > 0}
    assert not wider, f"pages wider than the window (by pixels): {wider}"


async def test_the_key_table_keeps_its_column_labels_on_a_phone(site: Site, tab: Page) -> None:
    await tab.set_viewport_size(PHONE)
    await sign_in(tab, site.gateway)
    await tab.goto(f"{site.gateway.url}/admin/projects/{site.project_id}")
    row = tab.locator("table.keys tbody tr").first
    shown = await row.evaluate(
        "row => [...row.cells].map(cell => getComputedStyle(cell, '::before').content.replaceAll('\"', ''))"
    )
    assert shown == ["Provider", "Key", "Status", "Last change", "Actions"]


async def test_the_keyboard_skips_to_the_content_and_sees_the_focus(site: Site, tab: Page) -> None:
    await sign_in(tab, site.gateway)
    await tab.goto(f"{site.gateway.url}/admin/projects/{site.project_id}")
    await tab.keyboard.press("Tab")
    skip = tab.get_by_role("link", name="Skip to the content")
    assert await skip.count() == 1, "the page starts with a skip link"
    assert await skip.evaluate("link => link === document.activeElement"), "the first Tab reaches it"
    box = await skip.bounding_box()
    assert box is not None, "the skip link shows once focused"
    assert box["y"] >= 0, "the skip link shows once focused"
    outline = await skip.evaluate("link => getComputedStyle(link).outlineStyle")
    assert outline != "none", "the focused element is outlined"
    await tab.keyboard.press("Enter")
    await tab.keyboard.press("Tab")
    focused = await tab.evaluate("document.activeElement.closest('main') !== null")
    assert focused, "after the skip link, the next Tab lands in the page's content, not the top bar"


async def test_the_charts_day_labels_stay_inside_the_chart(site: Site, tab: Page) -> None:
    await sign_in(tab, site.gateway)
    await tab.goto(f"{site.gateway.url}/admin/projects/{site.project_id}/usage")
    outside = await tab.evaluate(
        """[...document.querySelectorAll('svg text')].filter(text => {
             const box = text.getBBox(), view = text.ownerSVGElement.viewBox.baseVal;
             return box.x < view.x || box.x + box.width > view.x + view.width;
           }).map(text => text.textContent)"""
    )
    days = await tab.locator("figure.chart").first.locator("text.axis").all_text_contents()
    assert days[-1] == await tab.evaluate("new Date().toISOString().slice(5, 10)"), "today's label is shown"
    assert outside == [], f"labels cut at the chart's edge: {outside}"
