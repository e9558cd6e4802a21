"""Database: the async engine, transactions and schema migrations (Alembic, applied at start)."""

import os
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from credgate.storage.repository import Repository

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_WRITE_OPTION = "credgate_write"
# Arbitrary constant: serialises migrations of several instances starting at once on PostgreSQL.
_PG_MIGRATION_LOCK = 0x63726467


class StorageUnavailable(Exception):
    """The database does not answer; the message holds no connection secret."""


class Database:
    """The engine and its transactions. Every query goes through a `Repository` from `transaction()`."""

    def __init__(self, url: str, *, connect_args: Mapping[str, Any] | None = None) -> None:
        parsed = make_url(url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        if self.is_sqlite and parsed.database and parsed.database != ":memory:":
            _create_private_file(Path(parsed.database))
        self.engine = create_async_engine(url, connect_args=dict(connect_args or {}), pool_pre_ping=not self.is_sqlite)
        if self.is_sqlite:
            _configure_sqlite(self.engine.sync_engine)

    @asynccontextmanager
    async def transaction(self, *, write: bool = True) -> AsyncIterator[Repository]:
        """A unit of work: committed when the block ends, rolled back if it raises."""
        with _unavailable_on_failure(only=_CONNECTION_FAILURES):
            async with self.engine.connect() as connection:
                if write:
                    await connection.execution_options(**{_WRITE_OPTION: True})
                session = AsyncSession(bind=connection, expire_on_commit=False)
                async with session, session.begin():
                    yield Repository(session)

    async def ping(self) -> None:
        with _unavailable_on_failure():
            async with self.engine.connect() as connection:
                await connection.execute(text("SELECT 1"))

    async def has_schema(self) -> bool:
        with _unavailable_on_failure():
            async with self.engine.connect() as connection:
                return await connection.run_sync(lambda sync: inspect(sync).has_table("meta"))

    async def upgrade(self) -> None:
        """Apply every pending migration."""
        with _unavailable_on_failure():
            async with self.engine.begin() as connection:
                if connection.dialect.name == "postgresql":
                    await connection.execute(text(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})"))
                await connection.run_sync(_upgrade)

    async def dispose(self) -> None:
        await self.engine.dispose()


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


def _create_private_file(path: Path) -> None:
    # The database holds ciphertexts and token hashes: only its owner may read it (SQLite gives the -wal and
    # -shm files the same mode).
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _upgrade(connection: Connection) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def _configure_sqlite(engine: Any) -> None:
    # Python's sqlite3 opens transactions lazily; credgate begins them itself, IMMEDIATE for writes, so two
    # writers queue on the busy timeout instead of failing when a read lock cannot be upgraded.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=10000", "secure_delete=ON"):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        write = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
