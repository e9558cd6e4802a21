"""A dependency that stops answering (Redis, the database's notices), as one process sees it."""

import logging
import time
from collections.abc import Callable


class Outage:
    """Logs once when the dependency stops answering and once when it answers again, and paces the attempts
    made meanwhile: `may_try` lets one through every `retry_seconds`, so a dependency that hangs costs one wait a
    period, not one per request."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        down: str,
        back: str,
        retry_seconds: float = 1.0,
        report: Callable[[bool], None] | None = None,
    ) -> None:
        """`report` is told whether the dependency answers: now (it does, until shown otherwise), then at each
        change."""
        self._logger = logger
        self._report = report
        if report is not None:
            report(True)
        self._down = down  # formatted with the error's class name: a client's message may quote its URL
        self._back = back
        self.retry_seconds = retry_seconds
        self.failing = False
        self._next_try = 0.0

    def may_try(self) -> bool:
        if not self.failing:
            return True
        now = time.monotonic()
        if now < self._next_try:
            return False
        self._next_try = now + self.retry_seconds  # this attempt is the period's one
        return True

    def failed(self, error: BaseException) -> None:
        self._next_try = time.monotonic() + self.retry_seconds
        if not self.failing:
            self.failing = True
            self._logger.warning(self._down, type(error).__name__)
            if self._report is not None:
                self._report(False)

    def answered(self) -> None:
        if self.failing:
            self.failing = False
            self._logger.warning(self._back)
            if self._report is not None:
                self._report(True)
