"""What the workers and instances of one gateway share besides the database, through Redis: rate-limit counters
and notices of configuration changes. Optional: without `CREDGATE_REDIS_URL`, limits count per process and
changes are found by polling the database."""

from credgate.fleet.fleet import Fleet, open_fleet
from credgate.fleet.rate_limits import RateLimiter, RateLimits, SharedRateLimiter, retry_after_header

__all__ = ["Fleet", "RateLimiter", "RateLimits", "SharedRateLimiter", "open_fleet", "retry_after_header"]
