"""A database error, which the gateway logs with its text, names the failed statement but none of its values."""

import secrets

import pytest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from credgate.services.context import Context


async def test_a_failed_statement_is_named_without_the_values_bound_to_it(ctx: Context) -> None:
    canary = "canary-" + secrets.token_hex(8)
    with pytest.raises(SQLAlchemyError) as raised:
        async with ctx.database.engine.connect() as connection:
            await connection.execute(text("SELECT :value FROM no_such_table"), {"value": canary})
    assert "no_such_table" in str(raised.value)
    assert canary not in str(raised.value)
