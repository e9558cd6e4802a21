"""Running the gateway, and what its operator does beside: `serve`, `db upgrade`, `master-key`."""

import asyncio
import contextlib
import logging
import pickle
import socket
import sys
from collections.abc import Coroutine
from typing import Any

import click

from credgate.cli.base import actor, fail, main, pass_settings, run
from credgate.config import MAX_WORKERS, Settings
from credgate.crypto import encode_master_key, new_master_key
from credgate.errors import StartupError
from credgate.services import master_keys, panel_sessions
from credgate.services.bootstrap import open_context
from credgate.services.context import Context
from credgate.storage import Database, StorageUnavailable


@main.command()
@click.option("--host", help="Listen address [CREDGATE_HOST, default 127.0.0.1].")
@click.option("--port", type=int, help="Listen port [CREDGATE_PORT, default 8080].")
@click.option(
    "--workers",
    type=click.IntRange(1, MAX_WORKERS),
    help=f"Worker processes, 1 to {MAX_WORKERS}, each on a listening socket of its own: about one per core "
    "[CREDGATE_WORKERS, default 1].",
)
@pass_settings
def serve(settings: Settings, host: str | None, port: int | None, workers: int | None) -> None:
    """Run the gateway: proxy, admin API and panel, in one process or in --workers processes."""
    # The server's parts (uvicorn, the proxy, its HTTP client) are loaded for this command only: every other
    # command, a script's or a test's, starts without them.
    import uvicorn

    from credgate.app import create_app
    from credgate.server import (
        bind_listeners,
        check_pinning,
        configure_logging,
        exit_zero_on_sigterm,
        pin_worker,
        run_workers,
        server_config,
    )
    from credgate.tracing import tracing_requested

    settings = settings.model_copy(
        update={"host": host or settings.host, "port": port or settings.port, "workers": workers or settings.workers}
    )
    configure_logging(settings)

    async def run_server(listeners: list[socket.socket]) -> None:
        ctx = await _open_listen_and_announce(settings, listeners)
        server = uvicorn.Server(server_config(create_app(settings, context=ctx), settings))
        exit_zero_on_sigterm()
        try:
            await server.serve(sockets=listeners)
        finally:
            await ctx.close()

    async def prepare_workers(listeners: list[socket.socket]) -> str:
        """Migrations, the identity check and first-run setup happen here, once, before any worker starts."""
        ctx = await _open_listen_and_announce(settings, listeners)
        await ctx.close()
        if ctx.database.database_id is None:
            raise AssertionError("unreachable: open_context settles the database's id")
        return ctx.database.database_id

    try:
        tracing_requested()  # the OTEL_* variables checked before anything starts (each worker opens its tracing)
        check_pinning(settings)
        listeners = bind_listeners(settings)  # a port in use fails the start before anything else
        try:
            if settings.workers == 1:
                if settings.pin_workers:
                    pin_worker(0)
                _run_loop(run_server(listeners.all()))
            else:
                database_id = asyncio.run(prepare_workers(listeners.all()))
                run_workers(settings, create_app, listeners, database_id=database_id)
        finally:
            for listener in listeners.all():
                listener.close()
    except StartupError as error:
        fail(str(error), 5)


async def _open_listen_and_announce(settings: Settings, listeners: list[socket.socket]) -> Context:
    """Open (and migrate) the gateway's state, then listen and tell the operator where it serves: once, whatever
    the workers."""
    from credgate.server import listen

    ctx = await _open_context_lean(settings)
    try:
        listen(listeners)
        base = f"http://{settings.host}:{settings.port}"
        admin_listener = settings.admin_listener
        admin_base = base if admin_listener is None else f"http://{admin_listener[0]}:{admin_listener[1]}"
        click.echo(f"credgate is serving at {base}")
        click.echo(f"  proxy:     {base}/proxy/<provider>/<endpoint>")
        click.echo(f"  panel:     {admin_base}/admin")
        click.echo(f"  admin API: {admin_base}/api/v1 (create an admin token with: credgate admin create-token)")
        if admin_listener is not None:
            click.echo(f"  metrics:   {admin_base}/metrics (the admin listener only)")
        if settings.workers > 1:
            click.echo(f"  workers:   {settings.workers} processes")
        if settings.allow_private_upstreams:
            # A security-relevant mode must be impossible to miss: on the terminal and in the log.
            warning = (
                "CREDGATE_ALLOW_PRIVATE_UPSTREAMS is on: the SSRF guard is off, and integrations may reach "
                "loopback, private and cloud-metadata addresses over plain http"
            )
            click.echo(f"\nWARNING: {warning}", err=True)
            logging.getLogger("credgate").warning(warning)
        setup_token = await panel_sessions.issue_setup_token(ctx)
        if setup_token is not None:
            # Deliberately on the operator's terminal only (never logged): it works once, until an admin exists.
            setup_link = f"{admin_base}/admin/setup?token={setup_token}"
            click.echo(f"\nNo admin exists yet. Create the first one, once, at:\n  {setup_link}\n")
    except BaseException:
        await ctx.close()
        raise
    return ctx


async def _open_context_lean(settings: Settings) -> Context:
    """`open_context`, with a database to create or migrate set up first by a process of its own: alembic and what
    a migration loads would otherwise stay in the serving process for its whole life (15 MB of a worker's 100)."""
    if await _needs_set_up(settings):
        await _set_up_apart(settings)
    return await open_context(settings)


async def _needs_set_up(settings: Settings) -> bool:
    database = Database(settings.resolved_database_url)
    try:
        return not await database.is_current()
    except StorageUnavailable:
        return False  # nothing to do apart: open_context reports the database as it finds it
    finally:
        await database.dispose()


_REFUSED = 5  # the set-up process's exit status for a StartupError, whose message it writes on its stdout
# -P: the working directory is not put on the import path, so nothing there can pass for credgate.
_SET_UP_COMMAND = ("-P", "-c", "from credgate.cli.serving import set_up_from_stdin; set_up_from_stdin()")


async def _set_up_apart(settings: Settings) -> None:
    """`open_context` run once by a new interpreter, given the settings on its stdin (never in its arguments: a
    database URL may hold a password). Not through multiprocessing: its spawn would leave its resource tracker, a
    12 MB process, beside the gateway for good."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, *_SET_UP_COMMAND, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    try:
        refusal, _ = await child.communicate(pickle.dumps(settings))
    except BaseException:  # the start is interrupted (Ctrl-C): the set-up stops with it
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()
        raise
    if child.returncode == _REFUSED:
        raise StartupError(refusal.decode(errors="replace"))
    if child.returncode != 0:
        raise StartupError(
            f"the database's set-up failed in a process of its own (exit status {child.returncode}); see above"
        )


def set_up_from_stdin() -> None:
    """The process `_set_up_apart` starts: what `open_context` checks, migrates and creates at a first start or
    an upgrade, logged as the gateway logs; a refusal's message goes back on stdout."""
    from credgate.server import configure_logging

    settings = pickle.load(sys.stdin.buffer)  # noqa: S301 (written by the parent process, which started this one)
    configure_logging(settings)
    try:
        asyncio.run(_open_and_close(settings))
    except StartupError as error:
        sys.stdout.write(str(error))
        sys.exit(_REFUSED)
    except KeyboardInterrupt:  # the gateway's start, interrupted with it, says so
        sys.exit(130)


async def _open_and_close(settings: Settings) -> None:
    await (await open_context(settings)).close()


def _run_loop(coroutine: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # an optional speed-up, absent on Windows
        asyncio.run(coroutine)
    else:
        uvloop.run(coroutine)


@main.group()
def db() -> None:
    """The database."""


@db.command("upgrade")
@pass_settings
def db_upgrade(settings: Settings) -> None:
    """Create or migrate the schema (also done at every start)."""

    async def work(_ctx: Context) -> None:
        return None

    run(settings, work)
    click.echo("database is up to date")


@main.group("master-key")
def master_key() -> None:
    """The master key that seals every stored secret."""


@master_key.command("rotate")
@pass_settings
def master_key_rotate(settings: Settings) -> None:
    """Re-encrypt every secret under a new master key while the gateway keeps serving.

    With the key file, a new key is generated. With CREDGATE_MASTER_KEY, put the new key first (the old ones
    after, comma-separated), run this, then drop the old keys from the variable.
    """

    async def work(ctx: Context) -> int:
        return await master_keys.rotate_master_key(ctx, settings, actor=actor())

    resealed = run(settings, work)
    click.echo(f"master key rotated: {resealed} secrets re-encrypted")


@master_key.command("generate")
def master_key_generate() -> None:
    """Print a new random master key (for CREDGATE_MASTER_KEY)."""
    click.echo(encode_master_key(new_master_key()))
