"""Database: the async engine, transactions and schema migrations (Alembic, applied at start).

It also keeps the engine on the database it opened. A new connection must find the database's id (once the
bootstrap has settled it). On SQLite, connecting never creates the file (only `upgrade` does, at a start the
bootstrap allowed), and every connection is tied to the file it opened: once the file at the path is deleted or
replaced, every transaction fails with StorageUnavailable until a restart, instead of writing to a copy nobody
will read again.
"""

import asyncio
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote

from sqlalchemy import URL, Connection, event, inspect, text
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, NullPool, PoolResetState

from credgate.errors import StartupError
from credgate.storage.repository import Repository

logger = logging.getLogger(__name__)
MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# A unique index refused a row, which another transaction made at the same moment: the services' name for it.
DuplicateRow = IntegrityError
# The newest migration's revision (a test holds it to Alembic's head): a database already there is not migrated,
# and the process does not load Alembic (about 10 MB) to find that out.
HEAD_REVISION = "0017"
# The meta row holding the random id a database is given when it is created (see services/bootstrap.py).
DATABASE_ID = "database_id"
_SELECT_DATABASE_ID = "SELECT value FROM meta WHERE name = 'database_id'"
_WRITE_OPTION = "credgate_write"
_FILE_INFO = "credgate_file"  # the (device, inode) a pooled SQLite connection was opened on
# Bounds on waiting for PostgreSQL, so that a database that stops answering turns a request into a 503 instead of
# a hang: for a new connection, for a query's answer, and for a free connection in the pool. (A caller's
# `connect_args` may set others.)
PG_CONNECT_TIMEOUT_SECONDS = 5.0
PG_COMMAND_TIMEOUT_SECONDS = 15.0
POOL_TIMEOUT_SECONDS = 10.0
# SQLite's write-ahead log is copied into the database file every CHECKPOINT_SECONDS by `checkpoint_wal`, a task of
# each serving process; a commit copies it itself only past this many pages (SQLite's default, 1,000, made the
# commit that crossed it, the request log's under load, take up to 0.8 s), should that task not keep up.
CHECKPOINT_SECONDS = 1.0
_WAL_AUTOCHECKPOINT_PAGES = 10_000
# Each SQLite connection's page cache, in KiB (SQLite's default: 2,000). A connection runs in a thread of its own,
# its cache in that thread's malloc arena; at the default, the pooled connections' caches filled one after the other
# as the request log grew, a gateway's RSS rising 3 MB over a 10-minute soak (bench/run.py --soak 600). The pool
# hands out the connection given back last, so under load one or two are used and the others stay cold.
_SQLITE_CACHE_KIB = 512
# Arbitrary constant: serialises migrations of several instances starting at once on PostgreSQL.
_PG_MIGRATION_LOCK = 0x63726467

FileIdentity = tuple[int, int]


class StorageUnavailable(Exception):
    """The database does not answer, or is no longer the one opened; the message holds no connection secret."""


class Database:
    """The engine and its transactions. Every query goes through a `Repository` from `transaction()`."""

    def __init__(self, url: str, *, connect_args: Mapping[str, Any] | None = None) -> None:
        parsed = make_url(url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        # The SQLite file this engine guards; None for PostgreSQL, in-memory and `file:` URI databases.
        self.file = _sqlite_file(parsed)
        # Set by `claim_identity` once the bootstrap has settled which database this is.
        self.database_id: str | None = None
        self._unanswered = False  # logged once, not on every failing request
        self._file_gone = False
        self._closed_after_loss = False
        if self.file is not None:
            # Read-write, never create: a file deleted under the running gateway must not come back empty.
            parsed = parsed.set(
                database=f"file:{quote(str(self.file))}", query={**parsed.query, "mode": "rw", "uri": "true"}
            )
        bounds: dict[str, Any] = {}
        self._url, self._connect_args = parsed, dict(connect_args or {})
        if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "asyncpg":
            bounds = {"timeout": PG_CONNECT_TIMEOUT_SECONDS, "command_timeout": PG_COMMAND_TIMEOUT_SECONDS}
        engine_options: dict[str, Any]
        if not self.is_sqlite:
            engine_options = {"pool_timeout": POOL_TIMEOUT_SECONDS}
        elif self.file is None:  # in memory: one connection, in a pool that takes no order; reset as a file's (below)
            engine_options = {"pool_reset_on_return": None}
        else:
            # A connection given back is rolled back by _configure_sqlite's reset, only when a transaction is open;
            # the one given back last is taken next, so that the others' page caches stay cold (_SQLITE_CACHE_KIB).
            engine_options = {"pool_reset_on_return": None, "pool_use_lifo": True}
        try:
            self.engine = create_async_engine(
                parsed,
                connect_args={**bounds, **(connect_args or {})},
                pool_pre_ping=not self.is_sqlite,
                hide_parameters=True,  # see _keep_values_out_of_errors
                **engine_options,
            )
        except ModuleNotFoundError as missing:
            raise StartupError(_missing_driver(parsed, missing.name)) from None
        engine = self.engine.sync_engine
        _keep_values_out_of_errors(engine)
        if self.is_sqlite:
            _configure_sqlite(engine)
        event.listen(engine, "connect", self._on_connect)
        if self.file is not None:
            event.listen(engine, "checkout", self._on_checkout)
            event.listen(engine, "commit", self._on_commit)
            event.listen(engine, "checkin", self._on_checkin)

    @asynccontextmanager
    async def transaction(self, *, write: bool = True) -> AsyncIterator[Repository]:
        """A unit of work: committed when the block ends, rolled back if it raises."""
        await self._refuse_if_file_gone()
        try:
            with _unavailable_on_failure(only=_CONNECTION_FAILURES):
                async with self.engine.connect() as connection:
                    if write:
                        await connection.execution_options(**{_WRITE_OPTION: True})
                    session = AsyncSession(bind=connection, expire_on_commit=False)
                    async with session, session.begin():
                        yield Repository(session)
        except SQLAlchemyError:
            # A query failing on a database that is no longer this one (a PostgreSQL schema dropped under the
            # running gateway) is the database gone, not a bug.
            try:
                await self.ping()
            except StorageUnavailable as gone:
                raise StorageUnavailable(str(gone)) from None
            raise

    async def ping(self) -> None:
        """Return if the database answers and is still the one this engine opened; else StorageUnavailable."""
        await self._refuse_if_file_gone()
        with _unavailable_on_failure():
            async with self.engine.connect() as connection:
                if self.database_id is None:
                    await connection.execute(text("SELECT 1"))
                    return
                found = await connection.scalar(text(_SELECT_DATABASE_ID))
        if found != self.database_id:
            raise StorageUnavailable("the database is not the one this gateway opened")

    async def has_schema(self) -> bool:
        return await self._exists_and(lambda sync: inspect(sync).has_table("meta"))

    async def is_current(self) -> bool:
        """Whether the database exists with every migration applied: a start then has nothing to migrate."""
        return await self._exists_and(_is_current)

    async def _exists_and(self, check: Callable[[Connection], bool]) -> bool:
        """Whether the database exists and `check` holds of it, found without creating it."""
        if self.file is not None and _identity_of(self.file) is None:
            return False  # and connecting would not create it
        with _unavailable_on_failure():
            async with self.engine.connect() as connection:
                return await connection.run_sync(check)

    async def upgrade(self) -> None:
        """Create the database if there is none yet, and apply every pending migration."""
        if self.file is not None and _identity_of(self.file) is None:
            _create_private_file(self.file)
        with _unavailable_on_failure():
            async with self._unbounded() as engine, engine.begin() as connection:
                if connection.dialect.name == "postgresql":
                    await connection.execute(text(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})"))
                await connection.run_sync(_upgrade)

    async def claim_identity(self, candidate: str) -> str:
        """The database's id: the one it has, else `candidate`, stored now. The engine then serves only it."""
        with _unavailable_on_failure():
            async with self._unbounded() as engine, engine.connect() as connection:
                await connection.execution_options(**{_WRITE_OPTION: True})
                async with connection.begin():
                    if connection.dialect.name == "postgresql":
                        # Two first starts at once must agree on one id, not both insert theirs.
                        await connection.execute(text(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})"))
                    found = await connection.scalar(text(_SELECT_DATABASE_ID))
                    if found is None:
                        insert = text("INSERT INTO meta (name, value) VALUES (:name, :value)")
                        await connection.execute(insert, {"name": DATABASE_ID, "value": candidate})
        self.database_id = candidate if found is None else str(found)
        return self.database_id

    async def dispose(self) -> None:
        await self.engine.dispose()

    @asynccontextmanager
    async def _unbounded(self) -> AsyncIterator[AsyncEngine]:
        """The engine for start-up's steps, which may wait on another instance's migration or run a long one:
        on PostgreSQL one of their own, with no bound on a statement's time; else the engine."""
        if self.is_sqlite:
            yield self.engine
            return
        engine = create_async_engine(
            self._url,
            connect_args={**self._connect_args, "command_timeout": None},
            poolclass=NullPool,
            hide_parameters=True,  # as the engine's
        )
        _keep_values_out_of_errors(engine.sync_engine)
        try:
            yield engine
        finally:
            await engine.dispose()

    async def checkpoint_wal(self, every: float = CHECKPOINT_SECONDS) -> None:
        """SQLite: every `every` seconds, copy what the write-ahead log holds into the database file, from a
        connection of its own and off every writer's path; runs until cancelled. PASSIVE: what no reader still
        needs, waiting for no one (another process copying at the same moment is not waited for either)."""
        while True:
            await asyncio.sleep(every)
            try:
                async with self.engine.connect() as connection:
                    # The driver's own connection: SQLAlchemy would open a transaction first.
                    driver: Any = (await connection.get_raw_connection()).driver_connection
                    await (await driver.execute("PRAGMA wal_checkpoint(PASSIVE)")).close()
            except Exception:  # the database's health is watch_database's to report; the next round tries again
                logger.debug("write-ahead log checkpoint failed", exc_info=True)

    @property
    def can_notify(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    async def listen(
        self, channel: str, on_notice: Callable[[str | None], None], *, check_seconds: float = 5.0
    ) -> None:
        """Call `on_notice` with the payload of every notice on `channel` (PostgreSQL's LISTEN), and with None once
        it listens, on a connection of its own, until
        cancelled or the connection fails (StorageUnavailable); checked every `check_seconds`, since a listening
        connection that silently died would hear nothing."""
        with _unavailable_on_failure():
            async with self.engine.connect() as connection:
                # The driver's own connection: notices wait while a transaction is open, and SQLAlchemy would
                # open one for any statement.
                driver: Any = (await connection.get_raw_connection()).driver_connection

                def heard(_connection: object, _pid: int, _channel: str, payload: str) -> None:
                    on_notice(payload or None)

                ended = asyncio.Event()
                driver.add_termination_listener(lambda *_: ended.set())
                await driver.add_listener(channel, heard)
                try:
                    on_notice(None)  # listening from now: whatever came before may not have been heard
                    while True:
                        with suppress(TimeoutError):
                            await asyncio.wait_for(ended.wait(), check_seconds)
                        await driver.execute("SELECT 1")  # raises if the connection ended
                finally:
                    # Never back to the pool still listening.
                    await connection.invalidate()

    # Guards, run by the engine's events.

    def _on_connect(self, dbapi_connection: Any, record: Any) -> None:
        if self.file is not None:
            record.info[_FILE_INFO] = _identity_of(self.file)
        if self.database_id is None:
            return  # still starting: the bootstrap judges what it finds
        if _read_database_id(dbapi_connection) != self.database_id:
            if not self._unanswered:
                self._unanswered = True
                logger.error("the database is not the one this gateway opened (dropped, emptied or replaced)")
            raise StorageUnavailable("the database is not the one this gateway opened")
        if self._unanswered:
            self._unanswered = False
            logger.warning("database %s answers again", self.database_id)

    def _on_checkout(self, _dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        # One stat() per checkout, a few microseconds; the proxy's hot path reads its cache, not the database.
        if self.file is not None and (self._file_gone or _identity_of(self.file) != record.info.get(_FILE_INFO)):
            self._give_up_on_file(self.file)  # this connection is closed by the pool as the error goes by

    def _on_commit(self, connection: Connection) -> None:
        # A write is answered 2xx only if it lands in the file at the path: deleted or replaced since this
        # transaction began, the file it would go to is one nobody will read again. Not committed, it rolls back.
        if self.file is not None and _identity_of(self.file) != connection.info.get(_FILE_INFO):
            self._give_up_on_file(self.file)

    def _on_checkin(self, dbapi_connection: Any, record: Any) -> None:
        if self._file_gone and dbapi_connection is not None:
            record.invalidate()  # closed, not kept: see _give_up_on_file

    def _give_up_on_file(self, file: Path) -> NoReturn:
        """The file at the path is no longer the one the connections are on: refuse everything until a restart.

        No connection is made to whatever is at the path now, and those onto the old file are closed at once:
        closing the last connection of a file, SQLite checkpoints it and deletes its -wal by name, and that name
        may be a restored copy's by then (the README says: stop the gateway, restore, start).
        """
        problem = f"the database file {file} was deleted or replaced"
        if not self._file_gone:
            self._file_gone = True
            logger.error("%s: requests that need the database get 503 until the gateway is restarted", problem)
        raise StorageUnavailable(problem)

    async def _refuse_if_file_gone(self) -> None:
        if not self._file_gone:
            return
        if not self._closed_after_loss:
            self._closed_after_loss = True
            await self.engine.dispose()  # the idle connections; those in use close on their return
        raise StorageUnavailable(f"the database file {self.file} was deleted or replaced")


# The database did not answer (down, unreachable, locked too long), as opposed to a query that is wrong.
_CONNECTION_FAILURES: tuple[type[BaseException], ...] = (OperationalError, InterfaceError, OSError)


@contextmanager
def _unavailable_on_failure(
    only: tuple[type[BaseException], ...] = (SQLAlchemyError, OSError),
) -> Iterator[None]:
    # Only the kind of failure is told: a driver's message may quote the URL and its password.
    try:
        yield
    except only as error:
        raise StorageUnavailable(f"the database does not answer ({type(error).__name__})") from None


def _missing_driver(url: URL, module: str | None) -> str:
    extra = {"asyncpg": "postgres"}.get(module or "")
    install = f"pip install 'credgate[{extra}]'" if extra else f"install the Python package {module}"
    backend = url.get_backend_name()
    return f"CREDGATE_DATABASE_URL needs the {backend} driver {module}, which is not installed: {install}"


def _sqlite_file(url: URL) -> Path | None:
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:" or "uri" in url.query:
        return None
    # Absolute, so that what is checked with stat() is what SQLite opens whatever the working directory.
    return Path(url.database).absolute()


def _identity_of(path: Path) -> FileIdentity | None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def _read_database_id(dbapi_connection: Any) -> str | None:
    """The id in a new connection's database; None when it has none or is not credgate's (no `meta` table)."""
    try:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(_SELECT_DATABASE_ID)
            row = cursor.fetchone()
        finally:
            cursor.close()
        dbapi_connection.rollback()  # PostgreSQL's driver began a transaction for the query
    except Exception:  # whatever the driver's error class: not the database this engine opened
        return None
    return None if row is None else str(row[0])


def _create_private_file(path: Path) -> None:
    # The database holds ciphertexts and token hashes: only its owner may read it (SQLite gives the -wal and
    # -shm files the same mode).
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _is_current(connection: Connection) -> bool:
    return inspect(connection).has_table("alembic_version") and _revisions(connection) == [HEAD_REVISION]


def _upgrade(connection: Connection) -> None:
    if _is_current(connection):
        return
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def _revisions(connection: Connection) -> list[str]:
    return list(connection.execute(text("SELECT version_num FROM alembic_version")).scalars())


def _null(_value: None) -> None:
    return None


def _keep_values_out_of_errors(engine: Any) -> None:
    """A failed statement's error lists neither the values bound to it (hide_parameters, given to the engine) nor
    a stored row: PostgreSQL's DETAIL quotes the failing row or key (`Failing row contains (…)`), and asyncpg's
    error, the cause of SQLAlchemy's, prints it. Errors are logged with their causes; the DETAIL is dropped from
    both errors that hold it."""

    @event.listens_for(engine, "handle_error")
    def _drop_detail(context: ExceptionContext) -> None:
        for error in (context.original_exception, context.original_exception.__cause__):
            if getattr(error, "detail", None):
                error.detail = None  # type: ignore[union-attr]


def _configure_sqlite(engine: Any) -> None:
    # sqlite3 binds a None only after looking for its adapter, then for `__adapt__` on its protocol and
    # `__conform__` on None, each failed lookup an AttributeError formatted and dropped: 5 times an integer's cost.
    # The request log binds two or three a row, and its padding rows 16 each. Found here, it is NULL at once.
    sqlite3.register_adapter(type(None), _null)

    # Python's sqlite3 opens transactions lazily; credgate begins them itself, IMMEDIATE for writes, so two
    # writers queue on the busy timeout instead of failing when a read lock cannot be upgraded.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in (
            "journal_mode=WAL",
            "foreign_keys=ON",
            "busy_timeout=10000",
            "secure_delete=ON",
            f"wal_autocheckpoint={_WAL_AUTOCHECKPOINT_PAGES}",
            f"cache_size=-{_SQLITE_CACHE_KIB}",
        ):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine, "reset")
    def _on_reset(dbapi_connection: Any, record: ConnectionPoolEntry, state: PoolResetState) -> None:
        # A committed transaction's connection comes back with none open (sqlite3 knows, without asking aiosqlite's
        # thread): a rollback would be one round trip to that thread, one of the eight a request log's write made.
        driver = record.driver_connection
        if state.asyncio_safe and not state.terminate_only and driver is not None and driver.in_transaction:
            dbapi_connection.rollback()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        write = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
