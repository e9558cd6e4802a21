"""The specification's panel flows in a real browser, each followed by a real proxied call."""

import hashlib
import hmac
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Locator, Page, expect

from tests.browser.conftest import PASSWORD, screenshot, seen, sign_in
from tests.e2e.conftest import RunningGateway
from tests.secret_sweep import SWEEP
from tests.upstream import KeyJudge, Upstream, run_key_judge, run_webhook_receiver

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
KEY = "sk-test-panel-first-key-0000abcd"
EDITED_KEY = "sk-test-panel-edited-key-0000efgh"
ROTATED_KEY = "sk-test-panel-rotated-key-000ijkl"
CUSTOM_KEY = "custom-test-key-00000000mnop"
for _key in (KEY, EDITED_KEY, ROTATED_KEY, CUSTOM_KEY):
    SWEEP.register(_key)


async def create_project(page: Page, gateway: RunningGateway, name: str = "My app") -> tuple[str, str]:
    """Create a project in the panel; returns its page URL and the token shown once."""
    await page.goto(f"{gateway.url}/admin/projects")
    await page.get_by_label("Name").fill(name)
    await page.get_by_role("button", name="Create project").click()
    token = (await page.locator("#new-secret").inner_text()).strip()
    assert token.startswith("cgp_")
    project_url = page.url
    await page.reload()
    assert token not in await seen(page), "the token is shown once only"
    return project_url, token


async def proxied(gateway: RunningGateway, token: str, path: str, body: object = CHAT) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.post(f"{gateway.url}/proxy/{path}", json=body, headers={"Authorization": f"Bearer {token}"})


async def reload_until(page: Page, locator: Locator, text: str) -> None:
    """Reload until the locator shows the text: for what the gateway records in the background after answering."""
    for _ in range(50):
        await page.reload()
        if text in await locator.inner_text():
            return
        await page.wait_for_timeout(100)
    await expect(locator).to_contain_text(text)


async def point_at(gateway: RunningGateway, project_url: str, provider: str, upstream: Upstream) -> None:
    """The OpenAI template points at api.openai.com; tests move it to the stand-in (with the CLI)."""
    project_id = project_url.rstrip("/").rsplit("/", 1)[1]
    result = gateway.cli("integrations", "update", project_id, provider, "--base-url", f"{upstream.url}/v1")
    assert result.returncode == 0, result.stderr


async def test_first_run_setup_link_creates_the_admin_once(
    served: tuple[RunningGateway, str], page: Page, tmp_path: Path
) -> None:
    gateway, link = served
    await page.goto(link)
    await screenshot(page, "setup", tmp_path)
    await page.get_by_label("Username").fill("first")
    await page.get_by_label("Password (at least 12 characters)").fill(PASSWORD)
    await page.get_by_label("Password again").fill(PASSWORD)
    await page.get_by_role("button", name="Create account").click()
    await expect(page.get_by_role("status")).to_contain_text("Your account is ready")
    await page.goto(link)
    await expect(page.get_by_role("heading")).to_contain_text("This setup link is not valid")
    await sign_in(page, gateway, "first")
    await expect(page.get_by_role("heading", name="Projects")).to_be_visible()
    await expect(page.locator(".empty")).to_contain_text("No project yet")


async def test_add_new_api_from_the_chat_template_then_the_image_template_without_the_key(
    gateway: RunningGateway, page: Page, upstream: Upstream, tmp_path: Path
) -> None:
    await sign_in(page, gateway)
    project_url, token = await create_project(page, gateway)
    await screenshot(page, "project-empty", tmp_path)
    await page.get_by_role("link", name="Add new API").first.click()
    await screenshot(page, "add-new-api", tmp_path)
    await page.get_by_role("link", name=re.compile(r"^openai ")).click()
    await page.get_by_label("openai API key").fill(KEY)
    await page.get_by_label(re.compile("Chat completions")).check()
    await page.get_by_role("button", name="Review").click()
    await expect(page.locator(".summary")).to_contain_text("chat/completions")
    assert KEY not in await seen(page)
    await screenshot(page, "review", tmp_path)
    await page.get_by_role("button", name="Save").click()
    await expect(page.locator(".keys")).to_contain_text("…abcd")
    await point_at(gateway, project_url, "openai", upstream)
    assert (await proxied(gateway, token, "openai/chat/completions")).status_code == 200
    assert upstream.last.header("authorization") == f"Bearer {KEY}"

    await page.goto(f"{project_url}/add?provider=openai")
    await expect(page.get_by_label("openai API key")).to_have_count(0)  # the key is asked only once
    await page.get_by_label(re.compile("Image generations")).check()
    await page.get_by_role("button", name="Review").click()
    await expect(page.locator(".summary")).to_contain_text("the stored key is kept")
    await page.get_by_role("button", name="Save").click()
    await expect(page.get_by_role("status").first).to_contain_text("stored key is kept")
    images = await proxied(gateway, token, "openai/images/generations", {"prompt": "a cat", "n": 1, "size": "256x256"})
    assert images.status_code == 200
    await screenshot(page, "project", tmp_path)


async def test_custom_configure_then_endpoints(
    gateway: RunningGateway, page: Page, upstream: Upstream, tmp_path: Path
) -> None:
    await sign_in(page, gateway)
    _, token = await create_project(page, gateway)
    await page.get_by_role("link", name="Custom Configure").first.click()
    await page.get_by_label("Name in proxy paths").fill("acme")
    await page.get_by_label("Base URL").fill(f"{upstream.url}/v1")
    await page.get_by_label("API key").fill(CUSTOM_KEY)
    await page.get_by_label("How the key is sent").select_option("header")
    await page.get_by_label("Header or parameter name").fill("x-api-key")
    await page.get_by_label("Verification call (optional)").fill("GET models")
    await page.get_by_label("Check the key with the provider after saving").check()
    await screenshot(page, "custom-configure", tmp_path)
    await page.get_by_role("button", name="Create, then configure endpoints").click()
    await expect(page.get_by_role("heading")).to_contain_text("Endpoints of acme")
    await expect(page.get_by_role("status")).to_contain_text("Verification: the provider accepted the key (status 200)")
    assert (upstream.last.method, upstream.last.path_qs) == ("GET", "/v1/models")
    assert upstream.last.header("x-api-key") == CUSTOM_KEY
    assert (await proxied(gateway, token, "acme/chat/completions")).status_code == 403  # none allowed yet
    await page.get_by_label("Method of new row 1").select_option("POST")
    await page.get_by_label("Path of new row 1").fill("chat/completions")
    await page.get_by_role("button", name="Save endpoints").click()
    await expect(page.get_by_label("Path of row 1")).to_have_value("chat/completions")
    await screenshot(page, "endpoints", tmp_path)
    assert (await proxied(gateway, token, "acme/chat/completions")).status_code == 200
    assert upstream.last.header("x-api-key") == CUSTOM_KEY
    assert (await proxied(gateway, token, "acme/images/generations", {})).status_code == 403


async def test_edit_rotate_and_revoke_a_key(gateway: RunningGateway, page: Page, upstream: Upstream) -> None:
    await sign_in(page, gateway)
    project_url, token = await create_project(page, gateway)
    await page.goto(f"{project_url}/add?provider=openai")
    await page.get_by_label("openai API key").fill(KEY)
    await page.get_by_role("button", name="Review").click()
    await page.get_by_role("button", name="Save").click()
    await point_at(gateway, project_url, "openai", upstream)

    for action, key, hint in (("Edit", EDITED_KEY, "…efgh"), ("Rotate", ROTATED_KEY, "…ijkl")):
        await page.goto(project_url)
        await page.get_by_role("link", name=action, exact=True).click()
        await page.get_by_label("New API key").fill(key)
        await page.get_by_role("button", name="Save key").click()
        await expect(page.locator(".keys")).to_contain_text(hint)
        assert (await proxied(gateway, token, "openai/chat/completions")).status_code == 200
        assert upstream.last.header("authorization") == f"Bearer {key}"

    await page.get_by_role("link", name="Revoke", exact=True).click()
    await expect(page.locator(".warning")).to_contain_text("gets 403 until a new key is set")
    await page.get_by_role("button", name="Revoke key").click()
    await expect(page.locator(".keys")).to_contain_text("revoked")
    revoked = await proxied(gateway, token, "openai/chat/completions")
    assert (revoked.status_code, revoked.headers["x-credgate-error"]) == (403, "true")


async def test_confirming_who_you_are_goes_back_to_the_page_it_was_asked_from(
    gateway: RunningGateway, page: Page, tmp_path: Path
) -> None:
    """The page a session older than 15 minutes is sent to before a sensitive change (the server's clock cannot
    be moved here: tests/reliability/test_auth_isolation.py sends it there; this is the page in a browser)."""
    await sign_in(page, gateway)
    await page.goto(f"{gateway.url}/admin/confirm?next=/admin/audit")
    await expect(page.get_by_label("Username")).to_have_value("admin")
    await expect(page.get_by_label("Password")).to_be_focused()
    await screenshot(page, "confirm", tmp_path)
    await page.get_by_label("Password").fill("not the password")
    await page.get_by_role("button", name="Confirm").click()
    await expect(page.get_by_role("alert")).to_have_text("Wrong password.")
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Confirm").click()
    await expect(page).to_have_url(f"{gateway.url}/admin/audit")
    await expect(page.get_by_role("status")).to_contain_text("Confirmed. For the next 15 minutes")
    await seen(page)


async def test_usage_and_audit_pages(gateway: RunningGateway, page: Page, upstream: Upstream, tmp_path: Path) -> None:
    await sign_in(page, gateway)
    project_url, token = await create_project(page, gateway)
    await page.goto(f"{project_url}/add?provider=openai")
    await page.get_by_label("openai API key").fill(KEY)
    await page.get_by_role("button", name="Review").click()
    await page.get_by_role("button", name="Save").click()
    await point_at(gateway, project_url, "openai", upstream)
    for _ in range(3):
        await proxied(gateway, token, "openai/chat/completions")
    await page.wait_for_timeout(600)  # the request log is written within a second
    await page.goto(f"{project_url}/usage")
    titles = await page.locator("svg rect title").all_text_contents()
    assert len(titles) == 14 + 14 + 1  # two charts of the last 14 days, one bar per provider
    assert titles[13].endswith(": 3")  # today's requests
    assert sum(int(title.split(": ")[1]) for title in titles[14:28]) == 0  # no errors
    assert titles[28] == "openai: 36"  # 3 requests of 9 + 3 tokens
    await expect(page.locator("table").first).to_contain_text("openai")
    await screenshot(page, "usage", tmp_path)
    await page.goto(f"{gateway.url}/admin/audit")
    await expect(page.locator("table")).to_contain_text("integration.create")
    await screenshot(page, "audit", tmp_path)


async def test_a_phone_sized_screen_shows_the_key_table(gateway: RunningGateway, page: Page, tmp_path: Path) -> None:
    await page.set_viewport_size({"width": 390, "height": 844})
    await sign_in(page, gateway)
    project_url, _ = await create_project(page, gateway)
    await page.goto(f"{project_url}/add?provider=openai")
    await page.get_by_label("openai API key").fill(KEY)
    await page.get_by_role("button", name="Review").click()
    await page.get_by_role("button", name="Save").click()
    await expect(page.get_by_role("link", name="Rotate", exact=True)).to_be_visible()
    assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    await screenshot(page, "phone", tmp_path)


@pytest.fixture
async def judge() -> AsyncIterator[KeyJudge]:
    async with run_key_judge() as running:
        yield running


async def test_a_second_key_takes_over_when_the_provider_refuses_the_first_then_rotation_budgets_and_webhooks(
    gateway: RunningGateway, page: Page, judge: KeyJudge
) -> None:
    """The pool page through a refusal; then, in the same panel, the backup promoted with an overlap, a budget
    that ends in 402, and a webhook whose secret is shown once and whose test event arrives signed."""
    await sign_in(page, gateway)
    project_url, token = await create_project(page, gateway)
    project_id = project_url.rstrip("/").rsplit("/", 1)[1]
    add = ("integrations", "add", project_id, "pool", "--base-url", judge.url, "--api-key-stdin")
    added = gateway.cli(*add, stdin=KEY)
    assert added.returncode == 0, added.stderr
    assert gateway.cli("integrations", "set-endpoints", project_id, "pool", "* **").returncode == 0

    await page.goto(project_url)
    await page.get_by_role("link", name="Keys", exact=True).click()
    await page.get_by_label("Label").fill("backup account")
    await page.get_by_label("API key").fill(CUSTOM_KEY)
    await page.get_by_role("button", name="Add key").click()
    rows = page.locator("table.pool tbody tr")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(1)).to_contain_text("backup account")

    judge.answers[KEY] = (401, {})  # the first key's account was closed at the provider
    answer = await proxied(gateway, token, "pool/v1/chat/completions")
    assert answer.status_code == 200
    assert judge.keys_called() == [KEY, CUSTOM_KEY]
    # The proxy records the refusal in the background.
    await reload_until(page, rows.first, "out of service refused by the provider (401)")

    del judge.answers[KEY]  # reopened: the admin puts the key back
    await rows.first.get_by_role("button", name="Enable").click()
    await expect(rows.first).to_contain_text("active")
    assert KEY not in await seen(page)
    assert CUSTOM_KEY not in await seen(page)

    # Rotation: the backup promoted, the first key kept for an hour, then removed.
    await rows.nth(1).get_by_label("Keep the first key for").select_option("3600")
    await rows.nth(1).get_by_role("button", name="Promote").click()
    await expect(page.get_by_role("status")).to_contain_text("the previous first key is removed after 1 hour")
    await expect(rows.first).to_contain_text("backup account")
    await expect(rows.nth(1)).to_contain_text("removed at")
    assert (await proxied(gateway, token, "pool/v1/chat/completions")).status_code == 200
    assert judge.keys_called()[-1] == CUSTOM_KEY

    # A budget of one more request a day.
    await page.goto(project_url)
    await page.get_by_role("link", name="Budgets").click()
    await page.get_by_role("textbox", name=re.compile("^Limit")).fill("3")
    await page.get_by_label("Per", exact=True).select_option("day")
    await page.get_by_role("button", name="Add budget").click()
    await expect(page.locator("table.budgets tbody tr")).to_contain_text("Requests a day")
    statuses = [(await proxied(gateway, token, "pool/v1/chat/completions")).status_code for _ in range(2)]
    assert statuses == [200, 402]  # the two calls above counted too: started from the request log

    # A webhook: its secret shown once, its test event posted, signed, within seconds.
    async with run_webhook_receiver() as receiver:
        await page.goto(project_url)
        await page.get_by_role("link", name="Webhooks").click()
        await page.get_by_label("URL").fill(receiver.url)
        await page.get_by_role("button", name="Add webhook").click()
        secret = (await page.locator("#new-secret").inner_text()).strip()
        # Shown once by design (not a stored secret for the sweep); no later page shows it.
        assert secret.startswith("whsec_")
        await page.get_by_role("button", name="Send test").click()
        # The form's answer must be in before the reload below, or the reload races that navigation.
        await expect(page.get_by_role("status")).to_contain_text("Test event queued")
        await receiver.wait_for(1)
        headers, body = receiver.received[0]
        stamp, digest = (part.split("=", 1)[1] for part in headers["Credgate-Signature"].split(","))
        assert hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest() == digest
        # The delivery is recorded once the receiver's answer is back, a moment after the receiver has the event.
        await reload_until(page, page.locator("table.deliveries"), "delivered")
        assert secret not in await seen(page)
    assert KEY not in await seen(page)
    assert CUSTOM_KEY not in await seen(page)
