"""The CLI sets, replaces and clears an integration's private_networks (`--private-network`, repeatable;
`--no-private-networks`), with the guard on as the CLI always has it unless CREDGATE_ALLOW_PRIVATE_UPSTREAMS is set,
and `credgate audit` shows each change with the new list."""

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from credgate.cli import main
from tests.secret_sweep import SWEEP

KEY = "sk-test-cli-private-networks-00mnop"
OLLAMA = "http://127.0.0.1:11434"


@pytest.fixture
def credgate(tmp_path: Path) -> Any:
    runner = CliRunner()
    SWEEP.register(KEY)
    env = {"CREDGATE_DATA_DIR": str(tmp_path / "data")}

    def run(*args: str, stdin: str | None = None) -> Result:
        result = runner.invoke(main, list(args), input=stdin, env=env)
        SWEEP.capture(f"cli {args[:2]}", result.output)
        return result

    return run


@pytest.fixture
def project(credgate: Any) -> str:
    result = credgate("projects", "create", "self-hosted")
    assert result.exit_code == 0, result.output
    return str(json.loads(result.output)["project"]["id"])


def add(credgate: Any, project: str, *options: str) -> Result:
    result: Result = credgate(
        "integrations", "add", project, "ollama", "--base-url", OLLAMA, *options, "--api-key-stdin", stdin=KEY
    )
    return result


def test_add_takes_the_exceptions_and_is_refused_without_them(credgate: Any, project: str) -> None:
    refused = add(credgate, project)
    assert refused.exit_code != 0
    assert "base_url: must use https" in refused.output
    added = add(credgate, project, "--private-network", "127.0.0.1", "--private-network", "GPU-Box.")
    assert added.exit_code == 0, added.output
    assert json.loads(added.output)["private_networks"] == ["127.0.0.1/32", "gpu-box"]
    assert KEY not in added.output


def test_update_replaces_and_clears_the_list_and_each_change_is_audited(credgate: Any, project: str) -> None:
    assert add(credgate, project, "--private-network", "127.0.0.1").exit_code == 0
    networks = ["--private-network", "10.0.0.0/8", "--private-network", "127.0.0.1"]
    replaced = credgate("integrations", "update", project, "ollama", *networks)
    assert json.loads(replaced.output)["private_networks"] == ["10.0.0.0/8", "127.0.0.1/32"]
    untouched = credgate("integrations", "update", project, "ollama", "--timeout-seconds", "30")
    assert json.loads(untouched.output)["private_networks"] == ["10.0.0.0/8", "127.0.0.1/32"]
    cleared = credgate("integrations", "update", project, "ollama", "--no-private-networks")
    assert json.loads(cleared.output)["private_networks"] == []
    events = json.loads(credgate("audit", "--project", project).output)["items"]
    changes = [event["detail"] for event in events if event["action"] == "integration.private_networks"]
    assert changes == [
        {"private_networks": []},
        {"private_networks": ["10.0.0.0/8", "127.0.0.1/32"]},
        {"private_networks": ["127.0.0.1/32"]},
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--private-network", "169.254.169.254"], "private_networks: entry 1 may never include link-local"),
        (["--private-network", "10.0.0.0/8", "--no-private-networks"], "exclude each other"),
    ],
)
def test_update_refuses_link_local_and_contradictions(
    credgate: Any, project: str, options: list[str], message: str
) -> None:
    assert add(credgate, project, "--private-network", "127.0.0.1").exit_code == 0
    result = credgate("integrations", "update", project, "ollama", *options)
    assert result.exit_code == 2
    assert message in result.output
    shown = json.loads(credgate("integrations", "show", project, "ollama").output)
    assert shown["private_networks"] == ["127.0.0.1/32"]
