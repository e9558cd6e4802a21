"""A freshly migrated database, made once per test process and laid into each test's own empty database.

Running the Alembic migrations costs about half a second per test on SQLite and a second or more on PostgreSQL,
and most tests only need the schema they leave. So a test that opens `ctx` gets it laid in from a template instead:

- SQLite: the bytes of a database file the migrations just made, written into the test's (still absent) file.
- PostgreSQL: the statements the migrations executed (recorded once, reads left out) replayed in the test's own
  empty schema, in one transaction. A schema a test is done with serves the next test of the process
  (`PostgresSchemas`): if its shape is still the template's, its rows are deleted and the migrations' own rows
  written again, which takes a tenth of the time of a new schema.

The bootstrap then runs as in production on a database whose migrations are done: Alembic finds it at head, the
master-key check and the database id are written by `open_context` itself. The migrations themselves still run
from scratch in tests/storage/ and wherever a test opens a database without `ctx` (the CLI, `credgate serve`);
tests/storage/test_migrated_template.py proves the template's schema is the one the migrations make.
"""

import asyncio
import os
import secrets
import tempfile
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from sqlalchemy import Engine, event, text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from credgate.storage import Database
from credgate.storage.models import Base

T = TypeVar("T")

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


# What makes a schema's shape: its relations and columns with their types, defaults and nullability, its
# constraints and its indexes.
_SHAPE = """
SELECT md5(string_agg(part, ',' ORDER BY part)) FROM (
    SELECT c.relname || ':' || c.relkind::text || ':' || a.attname || ':' || format_type(a.atttypid, a.atttypmod)
        || ':' || a.attnotnull::text || ':' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') AS part
    FROM pg_class c
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
    WHERE c.relnamespace = current_schema()::regnamespace
    UNION ALL
    SELECT conrelid::regclass::text || ':' || conname || ':' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = current_schema()::regnamespace
    UNION ALL
    SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema()
) AS parts
"""
_SEQUENCES = "SELECT relname FROM pg_class WHERE relkind = 'S' AND relnamespace = current_schema()::regnamespace"


class PostgresSchemas:
    """A test process's PostgreSQL schemas: `take` gives a test a schema of its own, `give_back` keeps it for the
    next test when its shape is still the migrated template's (and drops it otherwise), `close` drops them all.

    The work runs on a thread of its own, over one connection kept open for the whole run: the tests' event loops
    last one test each, and a new connection's first look at the catalogs costs more than the emptying itself."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._idle: list[str] = []
        self._shape: str | None = None  # the template's, seen in the first schema it was laid into
        self._reset: str | None = None  # empties a schema of that shape and writes the migrations' rows again
        self._connection: asyncpg.Connection | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="postgres-schemas", daemon=True)
        self._thread.start()

    async def take(self, *, migrated: bool) -> str:
        """An empty schema, or (`migrated`) one with the migrated template laid in."""
        return await self._on_own_thread(self._take(migrated))

    async def give_back(self, schema: str) -> None:
        await self._on_own_thread(self._give_back(schema))

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _on_own_thread(self, work: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    async def _connected(self, schema: str) -> asyncpg.Connection:
        if self._connection is None:
            self._connection = await asyncpg.connect(self._url.replace("postgresql+asyncpg://", "postgresql://", 1))
        await self._connection.execute(f'SET search_path TO "{schema}"')
        return self._connection

    async def _take(self, migrated: bool) -> str:
        if migrated and self._idle:
            return self._idle.pop()
        schema = f"credgate_test_{secrets.token_hex(6)}"
        connection = await self._connected(schema)
        await connection.execute(f'CREATE SCHEMA "{schema}"')
        if migrated:
            async with connection.transaction():
                await connection.execute(await _postgres_template(self._url, {}))
            if self._shape is None:
                await self._learn(connection)
        return schema

    async def _give_back(self, schema: str) -> None:
        connection = await self._connected(schema)
        if self._reset is not None and await connection.fetchval(_SHAPE) == self._shape:
            async with connection.transaction():
                await connection.execute(self._reset)
            self._idle.append(schema)
        else:
            await connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    async def _close(self) -> None:
        if self._connection is not None:
            if self._idle:
                await self._connection.execute(";".join(f'DROP SCHEMA "{schema}" CASCADE' for schema in self._idle))
            await self._connection.close()
        self._idle.clear()

    async def _learn(self, connection: asyncpg.Connection) -> None:
        """The template's shape and the statements that bring a schema of that shape back to it."""
        self._shape = await connection.fetchval(_SHAPE)
        tables = ["alembic_version", *(table.name for table in reversed(Base.metadata.sorted_tables))]
        sequences = [row["relname"] for row in await connection.fetch(_SEQUENCES)]
        assert _postgres_script is not None
        rows = [
            statement
            for statement in _postgres_script.split(";\n")
            if statement.lstrip().split(None, 1)[0].upper() in {"INSERT", "UPDATE", "DELETE"}
        ]
        emptied = [f'DELETE FROM "{table}"' for table in tables]  # noqa: S608  (the models' own names)
        restarted = [f'ALTER SEQUENCE "{name}" RESTART' for name in sequences]
        self._reset = ";\n".join([*emptied, *restarted, *rows])
