"""The browser example (examples/browser) in Chromium: its backend mints a client token with the project token;
the page, on an origin of its own, streams a chat completion through credgate (a real cross-origin call, with a
preflight); no response the page receives carries the project token or the provider key."""

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, Response, expect

from tests.browser.conftest import seen
from tests.e2e.conftest import CREDGATE, RunningGateway, free_port
from tests.polling import eventually
from tests.secret_sweep import SWEEP, exposed
from tests.upstream import Upstream

BACKEND = Path(__file__).parents[2] / "examples" / "browser" / "backend.py"
KEY = "sk-test-browser-example-key-0000wxyz"
SWEEP.register(KEY)
SUBJECT = "demo-user"  # the example's one user
STREAMED = "Hello!"  # the stand-in's three chunks: "Hel", "lo", "!"
CHAT_PATH = "/proxy/openai/chat/completions"
WAIT_MS = 30_000  # a slow, busy machine: generous waits, never a fixed sleep


@dataclass
class Example:
    project_id: str
    project_token: str
    origin: str  # the page's, served by the example's backend: not the gateway's


@dataclass
class Traffic:
    """What the page received from its backend and from credgate, and the preflights Chromium sent (which
    Playwright's events leave out; the DevTools protocol reports them)."""

    responses: list[Response] = field(default_factory=list)
    preflights: list[dict[str, Any]] = field(default_factory=list)  # DevTools `Response` objects

    async def watch(self, page: Page) -> None:
        page.on("response", lambda response: self.responses.append(response))
        devtools = await page.context.new_cdp_session(page)
        devtools.on("Network.responseReceived", self._devtools_response)
        await devtools.send("Network.enable")

    def _devtools_response(self, event: dict[str, Any]) -> None:
        if event["type"] == "Preflight":
            self.preflights.append(event["response"])

    def to(self, path: str) -> list[Response]:
        return [response for response in self.responses if response.url.endswith(path)]

    async def texts(self) -> list[str]:
        """Each response's request line, status, headers and body as the page got them, and each preflight's
        answer (all recorded for the sweep)."""
        texts = []
        for response in self.responses:
            await response.finished()
            try:
                body = (await response.body()).decode(errors="replace")
            except PlaywrightError:  # nothing to read (a redirect)
                body = ""
            headers = "\n".join(f"{name}: {value}" for name, value in (await response.all_headers()).items())
            texts.append(f"{response.request.method} {response.url} {response.status}\n{headers}\n\n{body}")
        for preflight in self.preflights:
            texts.append(f"OPTIONS {preflight['url']} {preflight['status']}\n{json.dumps(preflight['headers'])}")
        for text in texts:
            SWEEP.capture(f"page response {text.splitlines()[0]}", text)
        return texts


def secrets_in(texts: list[str], *secrets: str) -> list[str]:
    """Where any of `secrets` shows, as written or encoded (base64, hex, percent, JSON)."""
    return [f"{secret[:6]}… in {text.splitlines()[0]}" for text in texts for secret in sorted(exposed(text, secrets))]


def credgate(gateway: RunningGateway, *args: str) -> Any:
    """A CLI command whose output shows a project token, run apart from `gateway.cli` (whose output the sweep
    reads): the test registers that token as a secret no page may show."""
    result = subprocess.run([CREDGATE, *args], capture_output=True, text=True, env=gateway.env, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def preflight(gateway: RunningGateway, origin: str) -> httpx.Response:
    asked = {"origin": origin, "access-control-request-method": "POST", "access-control-request-headers": "x-test"}
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.options(gateway.url + CHAT_PATH, headers=asked)


@contextmanager
def run_backend(gateway: RunningGateway, project_token: str, log: Path) -> Iterator[str]:
    """`examples/browser/backend.py` on a free port, the project token in its environment; yields its origin."""
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    env = {name: value for name, value in os.environ.items() if not name.startswith("CREDGATE_")}
    env |= {"CREDGATE_URL": gateway.url, "CREDGATE_PROJECT_TOKEN": project_token}
    with log.open("wb") as output:
        backend = subprocess.Popen(
            [sys.executable, str(BACKEND), "--port", str(port)], stdout=output, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + 30
        with httpx.Client(timeout=2) as client:
            while True:
                assert backend.poll() is None, log.read_text()
                try:
                    if client.get(f"{origin}/").status_code == 200:
                        break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, f"the example's backend did not answer: {log.read_text()}"
                    time.sleep(0.05)
        yield origin
    finally:
        backend.terminate()
        backend.wait(timeout=10)
        SWEEP.capture("example backend log", log.read_text(errors="replace"))


@pytest.fixture
async def example(gateway: RunningGateway, upstream: Upstream, tmp_path: Path) -> AsyncIterator[Example]:
    """A project with OpenAI pointed at the stand-in, the example's backend running with the project token, and
    the backend's origin the project's one allowed origin."""
    created = credgate(gateway, "projects", "create", "browser example")
    project_id, token = created["project"]["id"], created["secret"]
    SWEEP.register(token)
    add = ("integrations", "add", project_id, "openai", "--template", "openai-chat-completions")
    added = gateway.cli(*add, "--base-url", f"{upstream.url}/v1", "--api-key-stdin", stdin=KEY)
    assert added.returncode == 0, added.stderr

    with run_backend(gateway, token, tmp_path / "example-backend.log") as origin:
        updated = gateway.cli("projects", "update", project_id, "--allowed-origin", origin)
        assert updated.returncode == 0, updated.stderr

        async def listed() -> bool:
            return (await preflight(gateway, origin)).status_code == 204

        # A CLI change reaches the server within its change poll.
        assert await eventually(listed, within=30, every=0.1), "no preflight answered for the newly allowed origin"
        yield Example(project_id=project_id, project_token=token, origin=origin)


async def open_example(page: Page, example: Example) -> Traffic:
    traffic = Traffic()
    await traffic.watch(page)
    await page.goto(example.origin)
    await expect(page.get_by_role("status")).to_contain_text(f"a client token for {SUBJECT}", timeout=WAIT_MS)
    return traffic


async def send(page: Page, prompt: str) -> None:
    await page.get_by_placeholder("Ask something").fill(prompt)
    await page.get_by_role("button", name="Send").click()


async def test_the_page_streams_a_chat_completion_through_credgate_with_a_client_token_only(
    gateway: RunningGateway, upstream: Upstream, example: Example, page: Page
) -> None:
    traffic = await open_example(page, example)
    await send(page, "Say hello")

    # The stand-in's streamed chunks in the page; the request as the page made it, the key placed by credgate.
    await expect(page.locator("#output")).to_have_text(STREAMED, timeout=WAIT_MS)
    await expect(page.get_by_role("alert")).to_have_text("")
    sent = json.loads(upstream.last.body)
    assert (sent["stream"], sent["messages"]) == (True, [{"role": "user", "content": "Say hello"}])
    assert upstream.last.header("authorization") == f"Bearer {KEY}"
    [chat] = traffic.to(CHAT_PATH)
    assert chat.request.headers["authorization"].startswith("Bearer cgc_")
    assert (chat.status, chat.headers["access-control-allow-origin"]) == (200, example.origin)

    # Neither the project token nor the provider key in anything the page received, nor in the page.
    texts = await traffic.texts()
    texts.append(await seen(page))
    assert secrets_in(texts, example.project_token, KEY) == []

    # Chromium preflighted the cross-origin POST and credgate allowed it; an origin no project lists is refused.
    [allowed] = traffic.preflights
    assert (allowed["url"], allowed["status"]) == (gateway.url + CHAT_PATH, 204)
    headers = {name.lower(): value for name, value in allowed["headers"].items()}
    assert headers["access-control-allow-origin"] == example.origin
    assert set(headers["access-control-allow-headers"].split(",")) == {"authorization", "content-type"}
    refused = await preflight(gateway, f"http://127.0.0.1:{free_port()}")
    assert refused.status_code == 403
    assert "access-control-allow-origin" not in refused.headers

    # The request log names the example's user.
    records: list[dict[str, Any]] = []

    async def logged() -> bool:
        records[:] = json.loads(gateway.cli("projects", "requests", example.project_id).stdout)["items"]
        return bool(records)

    assert await eventually(logged, within=30, every=0.1), "the request is not in the request log"
    [record] = records
    assert (record["method"], record["endpoint"], record["status"]) == ("POST", "chat/completions", 200)
    by_subject = json.loads(gateway.cli("projects", "usage", example.project_id, "--group-by", "subject").stdout)
    assert [(row["group"], row["requests"]) for row in by_subject["items"]] == [(SUBJECT, 1)]
    assert record.get("subject") == SUBJECT, f"the request log's record shows no subject: {record}"


async def test_after_the_project_token_is_rotated_the_page_says_why_it_cannot_chat(
    gateway: RunningGateway, upstream: Upstream, example: Example, page: Page
) -> None:
    traffic = await open_example(page, example)
    await send(page, "first")
    await expect(page.locator("#output")).to_have_text(STREAMED, timeout=WAIT_MS)

    rotated = credgate(gateway, "projects", "rotate-token", example.project_id, "--grace-seconds", "0")
    SWEEP.register(rotated["secret"])

    async def refused() -> bool:  # the backend's project token, once the gateway has seen the rotation
        async with httpx.AsyncClient(timeout=10) as client:
            minted = await client.post(
                f"{gateway.url}/api/v1/client-tokens", headers={"authorization": f"Bearer {example.project_token}"}
            )
        return minted.status_code == 401

    assert await eventually(refused, within=30, every=0.1), "the gateway still takes the rotated project token"
    await send(page, "second")

    # The page's client token died with the project token: 401; a new one cannot be minted either.
    expected = "No client token: credgate refused a client token (401): invalid project token"
    await expect(page.get_by_role("alert")).to_have_text(expected, timeout=WAIT_MS)
    await expect(page.locator("#output")).to_have_text("")
    assert [response.status for response in traffic.to(CHAT_PATH)] == [200, 401]
    assert [response.status for response in traffic.to("/client-token")] == [200, 502]
    assert len(upstream.received) == 1
    texts = [*await traffic.texts(), await seen(page)]
    assert secrets_in(texts, example.project_token, rotated["secret"], KEY) == []
