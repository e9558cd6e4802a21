"""Limits of the data plane: a per-project rate limit (token bucket per minute) in this instance's memory."""

import math
import time
from dataclasses import dataclass


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float
    rate_per_minute: int


class RateLimiter:
    """Allows `rate_per_minute` requests per project, refilled continuously, bursting up to the full minute."""

    def __init__(self, *, max_projects: int = 100_000) -> None:
        self._buckets: dict[str, _Bucket] = {}
        self._max_projects = max_projects

    def acquire(self, project_id: str, rate_per_minute: int, *, now: float | None = None) -> float:
        """0 when the request may go now, else the seconds to wait before one may."""
        now = time.monotonic() if now is None else now
        bucket = self._buckets.get(project_id)
        if bucket is None or bucket.rate_per_minute != rate_per_minute:
            if len(self._buckets) >= self._max_projects:
                self._buckets.clear()
            bucket = self._buckets[project_id] = _Bucket(float(rate_per_minute), now, rate_per_minute)
        per_second = rate_per_minute / 60
        bucket.tokens = min(float(rate_per_minute), bucket.tokens + (now - bucket.updated) * per_second)
        bucket.updated = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / per_second


def retry_after_header(wait_seconds: float) -> str:
    return str(max(1, math.ceil(wait_seconds)))
