"""What every command shares: the `credgate` group, the settings, running a service call, JSON output,
secrets from standard input, and the exit codes."""

import asyncio
import getpass
import importlib
import json
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import click
from pydantic import BaseModel, ValidationError

from credgate.config import Settings
from credgate.error_responses import validation_message
from credgate.errors import Conflict, InvalidInput, NotFound, ServiceError, StartupError
from credgate.limits import describe, parse_float, parse_int
from credgate.services.bootstrap import open_context
from credgate.services.context import Context

T = TypeVar("T")
EXIT_CODES: dict[type[Exception], int] = {InvalidInput: 2, NotFound: 3, Conflict: 4, StartupError: 5}


def actor() -> str:
    return f"cli:{getpass.getuser()}"


def fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def run(settings: Settings, work: Callable[[Context], Awaitable[T]]) -> T:
    """Open the gateway's state, run one piece of work, close; errors become a message and an exit code."""

    async def main() -> T:
        ctx = await open_context(settings)
        try:
            return await work(ctx)
        finally:
            await ctx.close()

    try:
        return asyncio.run(main())
    except (ServiceError, StartupError) as error:
        fail(str(error), next((code for kind, code in EXIT_CODES.items() if isinstance(error, kind)), 1))
    raise AssertionError("unreachable")


def print_json(value: BaseModel | Sequence[BaseModel] | dict[str, Any]) -> None:
    if isinstance(value, list | tuple):
        value = {"items": [item.model_dump(mode="json") for item in value]}
    elif isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def read_secret(label: str) -> str:
    """A secret from standard input: typed without echo at a terminal, else the piped text."""
    if sys.stdin.isatty():
        return str(click.prompt(label, hide_input=True))
    value = sys.stdin.read().strip()
    if not value:
        fail(f"{label} was empty on standard input", 2)
    return value


class Limited(click.ParamType):  # type: ignore[type-arg]  # generic in recent click only; >=8.1 is allowed
    """A number within one of the domain's limits; otherwise a usage error (exit 2) naming the option."""

    def __init__(self, kind: object, *, whole: bool) -> None:
        self.kind = kind
        self.whole = whole
        self.name = "integer" if whole else "number"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | float:
        read = parse_int if self.whole else parse_float
        try:
            return read("value", self.kind, str(value))
        except InvalidInput as error:
            self.fail(error.problem, param, ctx)


def limited(kind: object, help_text: str, *, whole: bool = True) -> dict[str, Any]:
    """The option arguments for a number within `kind`, its range in the help."""
    return {"type": Limited(kind, whole=whole), "help": f"{help_text} ({describe(kind)})."}


pass_settings = click.make_pass_decorator(Settings)


class CommandsByModule(click.Group):
    """The `credgate` group: a command's module is imported when the command is asked for, so that `credgate
    serve` does not carry every other command (and the admin API's schemas they print) in its memory: 1.6 MB
    less. Each module adds its commands to the group as it loads."""

    modules: ClassVar[Mapping[str, str]] = {
        "admin": "admins",
        "audit": "audit",
        "budgets": "budgets",
        "db": "serving",
        "integrations": "integrations",
        "keys": "keys",
        "master-key": "serving",
        "projects": "projects",
        "serve": "serving",
        "templates": "integrations",
        "webhooks": "webhooks",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.commands.keys() | self.modules.keys())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.modules:
            importlib.import_module(f"credgate.cli.{self.modules[cmd_name]}")
        return self.commands.get(cmd_name)


@click.group(cls=CommandsByModule)
@click.version_option(package_name="credgate")
@click.pass_context
def main(click_ctx: click.Context) -> None:
    """credgate: a secure API gateway. Configuration: CREDGATE_* environment variables (see the README)."""
    try:
        click_ctx.obj = Settings()
    except ValidationError as error:
        fail(f"invalid configuration: {validation_message(list(error.errors()))}", 5)
