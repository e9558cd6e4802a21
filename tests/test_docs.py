"""Drift guards: every setting, CLI command and option, integration setting and service-error status is in the
README."""

from pathlib import Path

import click
import pytest

from credgate.admin_api.schemas import IntegrationPatchIn
from credgate.cli import main
from credgate.config import Settings
from credgate.errors import ServiceError
from credgate.limits import (
    ExpiresInSeconds,
    GraceSeconds,
    ListLimit,
    Name,
    RateLimitPerMinute,
    StreamIdleTimeoutSeconds,
    TimeoutSeconds,
    describe,
)

README = (Path(__file__).parents[1] / "README.md").read_text()


def commands(group: click.Group, prefix: str = "credgate") -> list[str]:
    return list(command_objects(group, prefix))


def command_objects(group: click.Group, prefix: str = "credgate") -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}
    context = click.Context(group)
    for name in group.list_commands(context):  # the commands of `main` load as they are asked for
        command = group.get_command(context, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            found |= command_objects(command, f"{prefix} {name}")
        else:
            found[f"{prefix} {name}"] = command
    return found


def options() -> list[str]:
    return sorted(
        {
            f"{name} {flag}"
            for name, command in command_objects(main).items()
            for parameter in command.params
            if isinstance(parameter, click.Option)
            for flag in (*parameter.opts, *parameter.secondary_opts)
            if flag.startswith("--")
        }
    )


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


@pytest.mark.parametrize("option", options())
def test_every_cli_option_is_documented(option: str) -> None:
    assert option.rpartition(" ")[2] in README, option


@pytest.mark.parametrize("name", sorted(IntegrationPatchIn.model_fields))
def test_every_integration_setting_is_documented(name: str) -> None:
    assert f"| `{name}`" in README or f", `{name}`" in README, name


@pytest.mark.parametrize(
    "kind",
    [TimeoutSeconds, StreamIdleTimeoutSeconds, GraceSeconds, ExpiresInSeconds, RateLimitPerMinute, ListLimit, Name],
    ids=lambda kind: describe(kind),
)
def test_every_range_is_documented_as_defined(kind: object) -> None:
    assert describe(kind).removeprefix("a whole number from ").removeprefix("a number ") in README


@pytest.mark.parametrize("error", service_errors(), ids=lambda error: error.__name__)
def test_every_service_error_status_is_documented(error: type[ServiceError]) -> None:
    assert f"| {error.status} " in README or f" {error.status} |" in README or f"/ {error.status} " in README
