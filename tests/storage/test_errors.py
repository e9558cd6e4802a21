"""A database error, which the gateway logs with its causes, names the failed statement but none of the values
bound to it, nor the stored row PostgreSQL quotes."""

import secrets
import traceback

import pytest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from credgate.services.context import Context


async def test_a_failed_statement_is_named_without_its_values_or_its_row(ctx: Context) -> None:
    canary = "canary-" + secrets.token_hex(8)
    async with ctx.database.engine.connect() as connection:
        await connection.execute(text("CREATE TEMPORARY TABLE canaries (secret TEXT, n INTEGER NOT NULL)"))
        with pytest.raises(SQLAlchemyError) as raised:
            # The value is bound, and PostgreSQL's DETAIL would quote it: "Failing row contains (canary-…, null)".
            await connection.execute(text("INSERT INTO canaries VALUES (:secret, NULL)"), {"secret": canary})
    logged = "".join(traceback.format_exception(raised.value))  # as a log line shows it: its causes too
    assert "canaries" in logged
    assert canary not in logged
