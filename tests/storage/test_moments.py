"""Moments as the database keeps them: UTC, whatever zone they were given in; on SQLite, the text SQLAlchemy's
DATETIME would write, so that values written before and after compare as text in every query."""

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import DateTime
from sqlalchemy.dialects import postgresql, sqlite

from credgate.services.usage import ProxiedRequest, _record_of
from credgate.storage import Database
from credgate.storage.models import UTCDateTime

MOMENTS = [
    datetime(2026, 11, 29, 10, 4, 41, 33724, tzinfo=UTC),
    datetime(2026, 1, 1, tzinfo=UTC),  # no microseconds: still written, as SQLAlchemy does
    datetime(999, 5, 6, 7, 8, 9, 10, tzinfo=timezone(timedelta(hours=5))),  # a year of three digits, east of UTC
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2026, 3, 29, 1, 30, tzinfo=ZoneInfo("Europe/Paris")),
    datetime(2026, 3, 29, 1, 30, tzinfo=ZoneInfo("UTC")),  # UTC, but not datetime.UTC
]


@pytest.mark.parametrize("moment", MOMENTS, ids=str)
def test_a_moment_is_written_on_sqlite_as_sqlalchemy_writes_its_utc_time(moment: datetime) -> None:
    dialect = sqlite.dialect()
    ours = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
    sqlalchemys = DateTime().dialect_impl(dialect).bind_processor(dialect)
    assert ours is not None
    assert sqlalchemys is not None
    assert ours(moment) == sqlalchemys(moment.astimezone(UTC).replace(tzinfo=None))


def test_a_naive_moment_is_refused_and_none_is_null_on_every_backend() -> None:
    for dialect in (sqlite.dialect(), postgresql.dialect()):  # type: ignore[no-untyped-call]
        bind: Callable[[datetime | None], object] | None = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
        assert bind is not None
        with pytest.raises(ValueError, match="naive"):
            bind(datetime(2026, 1, 1))
        assert bind(None) is None


async def test_a_request_log_moment_reads_back_in_utc_and_bounds_queries_to_the_microsecond(
    sqlite_database: Database,
) -> None:
    at = datetime(2026, 6, 1, 12, 0, 0, 500, tzinfo=ZoneInfo("Europe/Paris"))
    request = ProxiedRequest(
        at=at, project_id="p", token_hash="", request_id="r", method="POST", provider="openai", endpoint="x"
    )
    async with sqlite_database.transaction() as repo:
        await repo.insert_request_records([_record_of(request)])
    microsecond = timedelta(microseconds=1)
    async with sqlite_database.transaction(write=False) as repo:
        (record,) = await repo.list_request_records("p", limit=10)
        within = await repo.usage_totals("p", since=at, until=at + microsecond, group_by=None)
        before = await repo.usage_totals("p", since=at - microsecond, until=at, group_by=None)
    assert record.at == at
    assert record.at.tzinfo is UTC
    assert [row.requests for row in within] == [1]
    assert sum(row.requests for row in before) == 0
