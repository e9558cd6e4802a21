"""The log line formats: JSON lines carry the request they were written for; text lines are as before."""

import asyncio
import contextlib
import io
import json
import logging
import os
import re
import sys
from collections.abc import Iterator

import pytest

from credgate.log_format import (
    ACCESS_LOGGER,
    TEXT_FORMAT,
    AccessLog,
    CredgateHandler,
    JsonFormatter,
    LineFormatter,
    formatter,
    request_id,
)


def record(message: str, *, exc_info: object = None) -> logging.LogRecord:
    made = logging.LogRecord("credgate.proxy.relay", logging.WARNING, __file__, 1, message, (), exc_info)  # type: ignore[arg-type]
    made.created, made.msecs = 1_700_000_000.25, 250.0
    return made


def test_a_json_line_written_while_a_request_is_served_names_it() -> None:
    token = request_id.set("0123456789abcdef")
    try:
        line = json.loads(JsonFormatter().format(record("upstream refused")))
    finally:
        request_id.reset(token)
    assert line == {
        "time": "2023-11-14T22:13:20.250Z",
        "level": "warning",
        "logger": "credgate.proxy.relay",
        "pid": line["pid"],
        "message": "upstream refused",
        "request_id": "0123456789abcdef",
    }
    assert "request_id" not in json.loads(JsonFormatter().format(record("between requests")))


def test_a_json_line_keeps_its_exception_on_the_same_line() -> None:
    try:
        raise ValueError("the reason")
    except ValueError:
        formatted = JsonFormatter().format(record("failed", exc_info=sys.exc_info()))
    assert "\n" not in formatted
    assert json.loads(formatted)["exception"].endswith("ValueError: the reason")


def test_text_lines_keep_their_format() -> None:
    line = LineFormatter(TEXT_FORMAT).format(record("plain"))
    assert line.endswith("] WARNING credgate.proxy.relay: plain")
    assert line.startswith("2023-11-1")


@pytest.mark.parametrize("created", [1_700_000_000.25, 1_700_000_000.9996, 1_700_000_001.0])
def test_an_access_line_is_what_logging_would_format_of_its_record(
    created: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    line_formatter = LineFormatter(TEXT_FORMAT)
    message = "GET /proxy/openai/files/a%20b%s 200 0.1ms aaaa"  # a % of its own is not a format's
    made = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 1, message, (), None)
    made.created = created
    monkeypatch.setattr("credgate.log_format.time.time", lambda: created)
    assert line_formatter.access_line(message, "aaaa", None) == line_formatter.format(made)


@contextlib.contextmanager
def credgate_handler(log_format: str, *, level: int = logging.INFO) -> Iterator[io.StringIO]:
    """credgate's own handler as `credgate serve` installs it, writing to a buffer, alone on the root logger."""
    stream = io.StringIO()
    handler = CredgateHandler(stream)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers[:] = [handler]
    root.setLevel(level)
    try:
        yield stream
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])


async def test_access_lines_are_written_in_one_go_per_loop_turn_as_logging_would_write_them() -> None:
    with credgate_handler("text") as stream:
        access = AccessLog()
        access.write("GET /healthz 200 0.1ms aaaa", "aaaa", None)
        access.write("POST /proxy/openai/chat/completions 401 0.3ms bbbb", "bbbb", None)
        assert stream.getvalue() == ""  # not yet: at the end of this turn of the loop
        await asyncio.sleep(0)
        written = stream.getvalue()
        logging.getLogger(ACCESS_LOGGER).info("GET /readyz 200 0.2ms cccc")  # through logging, for comparison
    lines = stream.getvalue().splitlines()
    assert written.count("\n") == 2
    line = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[\d+\] INFO credgate\.access: (.*)$")
    assert [line.fullmatch(text).group(1) for text in lines] == [  # type: ignore[union-attr]
        "GET /healthz 200 0.1ms aaaa",
        "POST /proxy/openai/chat/completions 401 0.3ms bbbb",
        "GET /readyz 200 0.2ms cccc",
    ]


async def test_json_access_lines_carry_the_request_and_its_fields() -> None:
    with credgate_handler("json") as stream:
        AccessLog().write("GET /healthz 200 0.1ms aaaa", "aaaa", {"method": "GET", "status": 200})
        await asyncio.sleep(0)
    line = json.loads(stream.getvalue())
    assert line == {
        "time": line["time"],
        "level": "info",
        "logger": "credgate.access",
        "pid": os.getpid(),
        "message": "GET /healthz 200 0.1ms aaaa",
        "request_id": "aaaa",
        "http": {"method": "GET", "status": 200},
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])


async def test_access_lines_respect_the_level_and_go_through_logging_where_others_listen(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with credgate_handler("text", level=logging.WARNING) as stream:
        AccessLog().write("GET /healthz 200 0.1ms aaaa", "aaaa", None)
        await asyncio.sleep(0)
    assert stream.getvalue() == ""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)  # another handler: the line is a log record again
    AccessLog().write("GET /healthz 200 0.1ms bbbb", "bbbb", None)
    assert [record.getMessage() for record in caplog.records] == ["GET /healthz 200 0.1ms bbbb"]
