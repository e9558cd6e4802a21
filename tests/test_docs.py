"""Drift guards: every setting, CLI command and service-error status is in the README."""

from pathlib import Path

import click
import pytest

from credgate.cli import main
from credgate.config import Settings
from credgate.errors import ServiceError

README = (Path(__file__).parents[1] / "README.md").read_text()


def commands(group: click.Group, prefix: str = "credgate") -> list[str]:
    found = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += commands(command, f"{prefix} {name}")
        else:
            found.append(f"{prefix} {name}")
    return found


def service_errors(kind: type[ServiceError] = ServiceError) -> list[type[ServiceError]]:
    return [kind] + [sub for direct in kind.__subclasses__() for sub in service_errors(direct)]


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_setting_is_documented(name: str) -> None:
    assert f"`CREDGATE_{name.upper()}`" in README


@pytest.mark.parametrize("command", commands(main))
def test_every_cli_command_is_documented(command: str) -> None:
    """Named in full, or on a README line that names its group (`credgate projects list \\| create …`)."""
    group, _, last = command.rpartition(" ")
    lines = [line.replace("`", " ").replace("\\|", " ") for line in README.splitlines() if group in line]
    assert command in README or any(f" {last} " in f" {line} " for line in lines), command


@pytest.mark.parametrize("error", service_errors(), ids=lambda error: error.__name__)
def test_every_service_error_status_is_documented(error: type[ServiceError]) -> None:
    assert f"| {error.status} " in README or f" {error.status} |" in README or f"/ {error.status} " in README
