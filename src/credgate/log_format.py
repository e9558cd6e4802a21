"""How credgate's log lines look: text (the default) or JSON, one object per line (`CREDGATE_LOG_FORMAT`).

In JSON, every line written while a request is served carries its `request_id`, and the access line carries the
request's fields (`http`): method, path (never the query), status, duration, and for a proxied request its
project, provider and byte counts. Messages never hold a secret (the secret sweep of the tests reads them).
"""

import asyncio
import contextvars
import json
import logging
import os
import time
import traceback
from typing import Any, TextIO

TEXT_FORMAT = "%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s"
ACCESS_LOGGER = "credgate.access"
# Each held at its level or above whatever the process's. aiosqlite at INFO: at DEBUG it writes two lines for each
# database call, the call's SQL and bound values in each (user names, end users' ids), tens for a page of the panel,
# drowning credgate's own. Alembic's plugins at WARNING: it names each as it sets it up, seven lines before the first
# migration.
_CHATTY_LOGGERS = {"aiosqlite": logging.INFO, "alembic.runtime.plugins": logging.WARNING}
# The request a line is written for, set per request by the app (in JSON only: text lines name it themselves).
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("credgate_request_id", default=None)


def quiet_chatty_loggers(level: int) -> None:
    """Raise the chatty loggers to their level, where `level` (the process's) is below it."""
    for name, least in _CHATTY_LOGGERS.items():
        logging.getLogger(name).setLevel(max(level, least))


class LineFormatter(logging.Formatter):
    """logging's formatter with the time of day formatted once a second, not once a line (the access log writes
    a line per request)."""

    _second = -1
    _second_text = ""
    _access_pid = -1
    _access_format = ""
    utc = False

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return self.time_text(record.created)

    def time_text(self, created: float) -> str:
        second = int(created)
        return f"{self._text_of(second)},{int((created - second) * 1000):03d}"  # as logging's default_msec_format

    def _text_of(self, second: int) -> str:
        if second != self._second:
            moment = time.gmtime(second) if self.utc else self.converter(second)
            self._second_text = time.strftime(self.default_time_format, moment)
            self._second = second
        return self._second_text

    def access_line(self, message: str, request: str, fields: dict[str, Any] | None) -> str:
        """The access line as `format` would make it of the access logger's INFO record. The format is filled
        once for the process with all but the time and the message, so a line is one %-format of three values
        (callgrind: 7,500 instructions, against 17,600 filling the whole format from a dict each time)."""
        created = time.time()
        second = int(created)
        pid = os.getpid()
        if pid != self._access_pid:
            constant = {"process": pid, "levelname": "INFO", "name": ACCESS_LOGGER}
            self._access_format = self._fmt % (constant | {"asctime": "%s,%03d", "message": "%s"})  # type: ignore[operator]
            self._access_pid = pid
        return self._access_format % (self._text_of(second), (created - second) * 1000, message)


class JsonFormatter(LineFormatter):
    """One JSON object per line: time (UTC, RFC 3339), level, logger, pid, message, and where known the request
    id, the access fields (`http`) and the exception."""

    utc = True
    default_time_format = "%Y-%m-%dT%H:%M:%S"

    def format(self, record: logging.LogRecord) -> str:
        exception = None
        if record.exc_info:
            exception = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return self._line(
            record.created,
            record.levelname,
            record.name,
            record.process,
            record.getMessage(),
            getattr(record, "request_id", None) or request_id.get(),
            getattr(record, "http", None),  # None on every line but a JSON access line
            exception,
        )

    def access_line(self, message: str, request: str, fields: dict[str, Any] | None) -> str:
        return self._line(time.time(), "INFO", ACCESS_LOGGER, os.getpid(), message, request, fields, None)

    def _line(
        self,
        created: float,
        level: str,
        logger: str,
        pid: int | None,
        message: str,
        request: str | None,
        http: dict[str, Any] | None,
        exception: str | None,
    ) -> str:
        line: dict[str, Any] = {
            "time": f"{self.time_text(created)}Z".replace(",", "."),
            "level": level.lower(),
            "logger": logger,
            "pid": pid,
            "message": message,
        }
        if request is not None:
            line["request_id"] = request
        if http is not None:
            line["http"] = http
        if exception is not None:
            line["exception"] = exception
        return json.dumps(line, ensure_ascii=False, default=str)


def formatter(log_format: str) -> LineFormatter:
    return JsonFormatter() if log_format == "json" else LineFormatter(TEXT_FORMAT)


class CredgateHandler(logging.StreamHandler[TextIO]):
    """The handler `credgate serve` logs through (standard error, credgate's format): the one the access log
    may write to directly."""


class AccessLog:
    """The access line of every request: through `logging` like any other line, or, where credgate's own handler
    is the only one that would take it, formatted here and written once per event-loop turn. Through `logging`,
    the record, the handler and a write per line cost a worker about 5% of its time under load
    (bench/profile.py); here, the line is the same, and its cost a few microseconds."""

    def __init__(self) -> None:
        self._logger = logging.getLogger(ACCESS_LOGGER)
        self._handler = _sole_handler(self._logger)
        self._formatter = self._handler.formatter if self._handler is not None else None
        self._pending: list[str] = []

    def write(self, message: str, request: str, fields: dict[str, Any] | None) -> None:
        if not isinstance(self._formatter, LineFormatter):
            self._logger.info(message, extra={"http": fields, "request_id": request})
            return
        if not self._logger.isEnabledFor(logging.INFO):
            return
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(self._formatter.access_line(message, request, fields))

    def _flush(self) -> None:
        handler = self._handler
        if handler is None or not self._pending:
            return
        text = "\n".join(self._pending) + "\n"
        self._pending.clear()
        handler.acquire()  # the handler's own lock: a line of another thread is never cut in two
        try:
            handler.stream.write(text)
            handler.stream.flush()
        finally:
            handler.release()


def _sole_handler(logger: logging.Logger) -> CredgateHandler | None:
    """Credgate's handler when it is the only one a record of `logger` would reach, with no filter on the way."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        found += current.handlers
        current = current.parent if current.propagate else None
    if len(found) != 1 or not isinstance(found[0], CredgateHandler) or found[0].filters:
        return None
    return found[0]
