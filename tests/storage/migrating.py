"""Steps of the migration tests: Alembic to a revision on an open connection, and a table's columns."""

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncConnection

from credgate.storage.database import MIGRATIONS_DIR


def migrate(connection: sa.Connection, revision: str, *, down: bool = False) -> None:
    """Upgrade (or downgrade) the database on `connection` to `revision` (run it with `run_sync`)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    (command.downgrade if down else command.upgrade)(config, revision)


async def columns(connection: AsyncConnection, table: str) -> set[str]:
    found = await connection.run_sync(lambda sync: sa.inspect(sync).get_columns(table))
    return {column["name"] for column in found}
