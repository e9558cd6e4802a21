"""The log line formats: JSON lines carry the request they were written for; text lines are as before."""

import json
import logging
import sys

from credgate.log_format import TEXT_FORMAT, JsonFormatter, LineFormatter, request_id


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
