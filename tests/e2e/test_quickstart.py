"""The README's quickstart, run as written against a real server: if it breaks, a newcomer is stuck."""

import json
import re
import subprocess
from pathlib import Path

from tests.e2e.conftest import CREDGATE, RunningGateway
from tests.secret_sweep import SWEEP

README = Path(__file__).parents[2] / "README.md"


def quickstart_script() -> str:
    section = README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match is not None, "the README's quickstart has no sh block"
    return match.group(1)


def json_documents(text: str) -> list[dict[str, object]]:
    """The JSON objects printed one after another (curl prints no newline between them)."""
    decoder, documents, index = json.JSONDecoder(), [], 0
    while index < len(text):
        document, index = decoder.raw_decode(text, index)
        documents.append(document)
        while index < len(text) and text[index].isspace():
            index += 1
    return documents


def test_readme_quickstart_works_as_written(gateway: RunningGateway, tmp_path: Path) -> None:
    script = quickstart_script().replace("http://127.0.0.1:8080", gateway.url).replace(".venv/bin/credgate", CREDGATE)
    SWEEP.register("sk-your-openai-key")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=gateway.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    SWEEP.capture("quickstart output", result.stdout)
    project, first, second = json_documents(result.stdout)
    assert str(project["secret"]).startswith("cgp_")
    assert first["templates"] == ["openai-chat-completions"]
    assert second["templates"] == ["openai-chat-completions", "openai-image-generations"]
    assert second["key"] == first["key"]  # the stored key was kept, not re-entered
