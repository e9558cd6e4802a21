"""`credgate audit`: the audit log, its export and the check of its chain."""

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import click

from credgate.admin_api.schemas import AuditEventOut
from credgate.audit_chain import GENESIS, ChainBroken, verify_lines
from credgate.cli.base import fail, limited, main, pass_settings, print_json, run
from credgate.config import Settings
from credgate.limits import ListLimit
from credgate.services import audit
from credgate.services.context import Context


@main.group("audit", invoke_without_command=True)
@click.option("--limit", default=50, show_default=True, **limited(ListLimit, "How many, newest first"))
@click.option("--project", "project_id", help="Only this project's events.")
@pass_settings
def audit_group(settings: Settings, limit: int, project_id: str | None) -> None:
    """The audit log of changes, newest first; `export` and `verify` its hash chain."""
    if click.get_current_context().invoked_subcommand is not None:
        return
    events = run(settings, lambda ctx: audit.list_audit_events(ctx, limit=limit, project_id=project_id))
    print_json([AuditEventOut.of(event) for event in events])


@audit_group.command("export")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to this file, in place only once complete (default: standard output).",
)
@pass_settings
def audit_export(settings: Settings, output: Path | None) -> None:
    """Every entry of the audit log, oldest first, as JSON Lines with its previous_hash and hash.

    With --output, prints the number of entries and the head (the last entry's hash) once written.
    """

    async def export(ctx: Context, sink: BinaryIO) -> tuple[int, str]:
        entries, last = 0, None
        async for line in audit.export_audit_log(ctx):
            sink.write(line.encode())
            entries, last = entries + 1, line
        return entries, GENESIS if last is None else str(json.loads(last)["hash"])

    if output is None:
        run(settings, lambda ctx: export(ctx, sys.stdout.buffer))
        sys.stdout.buffer.flush()
        return
    with _replacing(output) as sink:
        entries, head = run(settings, lambda ctx: export(ctx, sink))
    click.echo(json.dumps({"entries": entries, "head": head}))


@contextmanager
def _replacing(path: Path) -> Iterator[BinaryIO]:
    """A new file (mode 0600) that takes `path`'s place once the block ends without error; else it is removed."""
    try:
        descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    except OSError as error:
        fail(f"cannot write {path}: {error.strerror}", 2)
        raise AssertionError("unreachable") from None
    try:
        with os.fdopen(descriptor, "wb") as sink:
            yield sink
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


@audit_group.command("verify")
@click.argument("file", type=click.File("rb"), required=False)
@click.option("--database", is_flag=True, help="Check the chain stored in the database instead of an export.")
@pass_settings
def audit_verify(settings: Settings, file: BinaryIO | None, database: bool) -> None:
    """Check an export (FILE, or - for standard input): every hash and every link, from the first entry.

    Prints {"verified": true, "entries": N, "head": HASH}; else names the first broken line and exits 2
    (with --database, the first broken entry's id, and exits 5). Entries removed from the end of an export
    leave a shorter chain that still verifies: compare its head with the one --database reports.
    """
    if database == (file is not None):
        fail("give an export FILE (- for standard input), or --database", 2)
    if file is None:
        stored = run(settings, audit.verify_audit_log)
        if not stored.verified:
            where = "at its end" if stored.entry_id is None else f"at entry id {stored.entry_id}"
            verdict = {"verified": False, "entries": stored.entries, "id": stored.entry_id, "problem": stored.problem}
            _print_line(verdict)
            fail(f"the audit log in the database does not verify {where}: {stored.problem}", 5)
        _print_line({"verified": True, "entries": stored.entries, "head": stored.head})
        return
    try:
        chain = verify_lines(file)
    except ChainBroken as broken:
        _print_line({"verified": False, "line": broken.position, "problem": broken.problem})
        fail(f"line {broken.position}: {broken.problem}", 2)
        return
    _print_line({"verified": True, "entries": chain.entries, "head": chain.head})


def _print_line(value: dict[str, Any]) -> None:
    click.echo(json.dumps(value, ensure_ascii=False))
