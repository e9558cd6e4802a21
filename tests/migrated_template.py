"""A freshly migrated database, made once per test process and laid into each test's own empty database.

Running the Alembic migrations costs about half a second per test on SQLite and a second or more on PostgreSQL,
and most tests only need the schema they leave. So the `ctx` fixture lays the schema in from a template instead:

- SQLite: the bytes of a database file the migrations just made, written into the test's (still absent) file.
- PostgreSQL: the statements the migrations executed (recorded once, reads left out) replayed in the test's own
  empty schema, in one transaction.

The bootstrap then runs as in production on a database whose migrations are done: Alembic finds it at head, the
master-key check and the database id are written by `open_context` itself. The migrations themselves still run
from scratch in tests/storage/ and wherever a test opens a database without `ctx` (the CLI, `credgate serve`);
tests/storage/test_migrated_template.py proves the template's schema is the one the migrations make.
"""

import os
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from credgate.storage import Database

_sqlite_image: bytes | None = None
_postgres_script: str | None = None


async def lay_in_migrated_schema(url: str, connect_args: dict[str, Any]) -> None:
    """Give the test's database the schema the migrations make, if it has nothing yet (else leave it)."""
    database = Database(url, connect_args=connect_args)
    try:
        if database.file is not None:
            if not database.file.exists():
                _write_private(database.file, await _sqlite_template())
            return
        script = await _postgres_template(url, connect_args)
        async with database.engine.begin() as connection:
            if await _has_tables(connection):
                return
            driver = (await connection.get_raw_connection()).driver_connection
            assert driver is not None
            await driver.execute(script)  # one round trip: the whole script at once
    finally:
        await database.dispose()


async def _sqlite_template() -> bytes:
    global _sqlite_image
    if _sqlite_image is None:
        with tempfile.TemporaryDirectory() as folder:
            file = Path(folder) / "template.db"
            database = Database(f"sqlite+aiosqlite:///{file}")
            await database.upgrade()
            await database.dispose()  # the last connection closing checkpoints the WAL into the file
            assert not file.with_name(file.name + "-wal").exists(), "the template's WAL was not checkpointed"
            _sqlite_image = file.read_bytes()
    return _sqlite_image


async def _postgres_template(url: str, connect_args: dict[str, Any]) -> str:
    """What the migrations execute in an empty schema, recorded in a scratch schema of this process's own."""
    global _postgres_script
    if _postgres_script is None:
        schema = f"credgate_template_{os.getpid()}_{os.urandom(4).hex()}"
        admin = create_async_engine(url)
        async with admin.begin() as connection:
            await connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        try:
            args = {**connect_args, "server_settings": {"search_path": schema}}
            database = Database(url, connect_args=args)
            recorded: list[str] = []

            def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
                # Reads (reflection, Alembic's version look-ups, the migration lock) change nothing: left out.
                if statement.lstrip().split(None, 1)[0].upper() not in {"SELECT", "SHOW"}:
                    assert not parameters, f"a migration statement with parameters cannot be replayed: {statement}"
                    recorded.append(statement)

            # On every engine: the migrations run on an engine of their own (Database._unbounded).
            event.listen(Engine, "before_cursor_execute", record)
            try:
                await database.upgrade()
            finally:
                event.remove(Engine, "before_cursor_execute", record)
                await database.dispose()
            _postgres_script = ";\n".join(recorded)
        finally:
            async with admin.begin() as connection:
                await connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
            await admin.dispose()
    return _postgres_script


async def _has_tables(connection: AsyncConnection) -> bool:
    query = "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()"
    return bool(await connection.scalar(text(query)))


def _write_private(path: Path, content: bytes) -> None:
    # As Database.upgrade creates it: owner-only, since the file will hold ciphertexts and token hashes.
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as output:
        output.write(content)
