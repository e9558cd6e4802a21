"""The README's quickstart, run as written against a real `credgate serve`: if it breaks, a newcomer is stuck.

The OpenAI template points at api.openai.com, which no test may reach, so between the set-up block and the
first proxied call the integration's base URL is moved to the stand-in upstream, with the CLI.
"""

import asyncio
import json
import re
from pathlib import Path

from tests.e2e.conftest import CREDGATE, RunningGateway
from tests.secret_sweep import SWEEP
from tests.upstream import Upstream

README = Path(__file__).parents[2] / "README.md"


def quickstart_blocks() -> list[str]:
    section = README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def json_documents(text: str) -> list[dict[str, object]]:
    """The JSON objects printed one after another (curl prints no newline between them)."""
    decoder, documents, index = json.JSONDecoder(), [], 0
    while index < len(text):
        document, index = decoder.raw_decode(text, index)
        documents.append(document)
        while index < len(text) and text[index].isspace():
            index += 1
    return documents


async def run_bash(script: str, cwd: Path, env: dict[str, str]) -> str:
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        script,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, stderr.decode()
    SWEEP.capture("quickstart output", stdout.decode() + stderr.decode())
    return stdout.decode()


async def test_readme_quickstart_works_as_written(gateway: RunningGateway, upstream: Upstream, tmp_path: Path) -> None:
    setup, first_call = quickstart_blocks()[:2]
    SWEEP.register("sk-your-openai-key")
    move_upstream = f'{CREDGATE} integrations update "$PROJECT_ID" openai --base-url {upstream.url}/v1 >/dev/null\n'
    setup = setup.replace(".venv/bin/credgate", CREDGATE)
    script = (setup + move_upstream + first_call).replace("http://127.0.0.1:8080", gateway.url)
    output = await run_bash(script, tmp_path, gateway.env)
    project, first, second, completion = json_documents(output)
    assert str(project["secret"]).startswith("cgp_")
    assert first["templates"] == ["openai-chat-completions"]
    assert second["templates"] == ["openai-chat-completions", "openai-image-generations"]
    assert second["key"] == first["key"]  # the stored key was kept, not re-entered
    assert completion["object"] == "chat.completion"
    assert upstream.last.header("authorization") == "Bearer sk-your-openai-key"


def test_a_first_start_logs_its_migrations_but_not_alembic_setting_itself_up(gateway: RunningGateway) -> None:
    log = gateway.log.read_text()  # the gateway logs at DEBUG
    assert "Running upgrade  -> 0001, initial schema" in log
    assert "setup plugin" not in log
