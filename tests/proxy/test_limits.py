"""The per-project rate limit: a token bucket per minute, bursting up to the full minute."""

import pytest

from credgate.fleet import RateLimiter, retry_after_header


def burst(limiter: RateLimiter, project: str, rate: int, *, now: float) -> int:
    """How many requests pass at `now` before the first is refused."""
    passed = 0
    while limiter.acquire(project, rate, now=now) == 0:
        passed += 1
        assert passed <= rate, "the bucket let through more than its size"
    return passed


def test_a_full_minute_bursts_then_refuses() -> None:
    assert burst(RateLimiter(), "p", 5, now=100.0) == 5


def test_the_wait_is_the_time_to_the_next_token() -> None:
    limiter = RateLimiter()
    burst(limiter, "p", 6, now=0.0)  # one token every ten seconds
    assert limiter.acquire("p", 6, now=0.0) == pytest.approx(10.0)
    assert limiter.acquire("p", 6, now=4.0) == pytest.approx(6.0)


def test_tokens_refill_continuously() -> None:
    limiter = RateLimiter()
    burst(limiter, "p", 6, now=0.0)
    assert limiter.acquire("p", 6, now=9.9) > 0
    assert limiter.acquire("p", 6, now=10.0) == 0
    assert limiter.acquire("p", 6, now=10.0) > 0
    assert burst(limiter, "p", 6, now=40.0) == 3


def test_refill_never_exceeds_one_minute_of_requests() -> None:
    limiter = RateLimiter()
    burst(limiter, "p", 3, now=0.0)
    assert burst(limiter, "p", 3, now=3600.0) == 3


def test_projects_have_their_own_buckets() -> None:
    limiter = RateLimiter()
    burst(limiter, "a", 2, now=0.0)
    assert limiter.acquire("a", 2, now=0.0) > 0
    assert burst(limiter, "b", 2, now=0.0) == 2


def test_a_changed_rate_takes_effect_at_once() -> None:
    limiter = RateLimiter()
    burst(limiter, "p", 1, now=0.0)
    assert burst(limiter, "p", 4, now=0.0) == 4


def test_many_projects_stay_bounded() -> None:
    limiter = RateLimiter(max_projects=10)
    for index in range(100):
        assert limiter.acquire(f"p{index}", 1, now=0.0) == 0
    assert len(limiter._buckets) <= 10


@pytest.mark.parametrize(("wait", "header"), [(0.001, "1"), (0.5, "1"), (1.0, "1"), (1.01, "2"), (19.2, "20")])
def test_retry_after_is_whole_seconds_rounded_up(wait: float, header: str) -> None:
    assert retry_after_header(wait) == header
