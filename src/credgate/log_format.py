"""How credgate's log lines look: text (the default) or JSON, one object per line (`CREDGATE_LOG_FORMAT`).

In JSON, every line written while a request is served carries its `request_id`, and the access line carries the
request's fields (`http`): method, path (never the query), status, duration, and for a proxied request its
project, provider and byte counts. Messages never hold a secret (the secret sweep of the tests reads them).
"""

import contextvars
import json
import logging
import time
import traceback
from typing import Any

TEXT_FORMAT = "%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s"
# The request a line is written for, set per request by the app (in JSON only: text lines name it themselves).
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("credgate_request_id", default=None)


class LineFormatter(logging.Formatter):
    """logging's formatter with the time of day formatted once a second, not once a line (the access log writes
    a line per request)."""

    _second = -1
    _second_text = ""
    utc = False

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            moment = time.gmtime(record.created) if self.utc else self.converter(record.created)
            self._second_text = time.strftime(self.default_time_format, moment)
            self._second = second
        return f"{self._second_text},{int(record.msecs):03d}"  # as logging's default_msec_format


class JsonFormatter(LineFormatter):
    """One JSON object per line: time (UTC, RFC 3339), level, logger, pid, message, and where known the request
    id, the access fields (`http`) and the exception."""

    utc = True
    default_time_format = "%Y-%m-%dT%H:%M:%S"

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": f"{self.formatTime(record)}Z".replace(",", "."),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        found = getattr(record, "request_id", None) or request_id.get()
        if found is not None:
            line["request_id"] = found
        http = getattr(record, "http", None)  # None on every line but a JSON access line
        if http is not None:
            line["http"] = http
        if record.exc_info:
            line["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(line, ensure_ascii=False, default=str)


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else LineFormatter(TEXT_FORMAT)
