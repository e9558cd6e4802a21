"""Prometheus metrics (README, Metrics), kept by each process and summed for `/metrics`.

With several workers, prometheus-client's multiprocess mode sums every worker's values: `credgate serve
--workers N` gives the workers a folder of their own in `PROMETHEUS_MULTIPROC_DIR` (which must be set before this
module is first imported). Labels hold ids and names an admin chose, never a token, key, header or body.
"""

import asyncio
import bisect
import os
from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"
Key = TypeVar("Key")
_process_id = os.getpid()


def _forked() -> None:
    global _process_id
    _process_id = os.getpid()


if MULTIPROCESS_DIR in os.environ:
    # A worker's process id, known: by default each count asks the kernel for it (to notice a fork), a system call
    # for each of the dozen counts of a request. A fork is noticed here instead, once.
    os.register_at_fork(after_in_child=_forked)
    values.ValueClass = values.MultiProcessValue(lambda: _process_id)  # type: ignore[no-untyped-call]

# From a fraction of a millisecond (the gateway's own time) to the minutes a long generation takes.
_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

requests_total = Counter(
    "credgate_requests", "Proxied requests, by project id, provider and status.", ["project", "provider", "status"]
)
request_duration = Histogram(
    "credgate_request_duration_seconds", "Proxied requests' time, to the last byte.", ["provider"], buckets=_SECONDS
)
overhead_duration = Histogram(
    "credgate_overhead_duration_seconds",
    "The time credgate itself adds to a proxied request: before the upstream request and from the upstream's "
    "response head to the client's (all of it when no upstream was asked).",
    buckets=_SECONDS[:10],
)
tokens_total = Counter(
    "credgate_tokens", "Tokens the providers reported, by kind (prompt or completion).", ["project", "provider", "kind"]
)
in_flight = Gauge("credgate_in_flight_requests", "Proxied requests being served.", multiprocess_mode="livesum")
streams_open = Gauge("credgate_sse_streams_open", "Event streams being relayed.", multiprocess_mode="livesum")
upstream_failures = Counter(
    "credgate_upstream_failures",
    "Upstreams not reached, by kind: unreachable, timeout, not_public.",
    ["provider", "kind"],
)
key_failovers = Counter(
    "credgate_key_failovers",
    "Requests passed on to the next key of a pool, by provider and reason: refused (401, 403), cooling (429, 402).",
    ["provider", "reason"],
)
request_records_dropped = Counter(
    "credgate_request_records_dropped",
    "Request log records dropped, the oldest first, because the database fell too far behind.",
)
budget_refusals = Counter(
    "credgate_budget_refusals",
    "Requests refused (402) because a budget of their project was spent, by project.",
    ["project"],
)
# End users are counted, never labelled: a label per user would grow without bound and name people.
subject_requests = Counter(
    "credgate_subject_requests",
    "Proxied requests made for an end user (a client token's or an identity token's subject), by project.",
    ["project"],
)
client_tokens_minted = Counter("credgate_client_tokens_minted", "Client tokens minted, by project.", ["project"])
identity_refusals = Counter(
    "credgate_identity_refusals",
    "End users' identity tokens refused, by reason (expired, wrong_audience, bad_signature, ...).",
    ["reason"],
)
oauth_token_fetches = Counter(
    "credgate_oauth_token_fetches",
    "Access tokens fetched from OAuth 2.0 token endpoints, by provider and result: ok or failed.",
    ["provider", "result"],
)
# Each worker's view; the lowest wins, so that one worker cut off from a dependency shows.
dependency_up = Gauge(
    "credgate_dependency_up",
    "Whether a dependency answers (1) or not (0), as the processes last saw it: database, redis.",
    ["dependency"],
    multiprocess_mode="livemin",
)
events_emitted = Counter("credgate_events", "Events written for the projects' webhooks, by type.", ["type"])
event_deliveries = Counter(
    "credgate_event_deliveries",
    "Webhook delivery attempts, by outcome: delivered, retried (to be tried again), failed (after every retry).",
    ["outcome"],
)
# Every process scans the same database: the highest (latest) count of any of them.
keys_over_age = Gauge(
    "credgate_provider_keys_over_age",
    "Provider keys whose secret is older than their project's key age policy.",
    multiprocess_mode="livemax",
)
access_lookups = Counter("credgate_access_lookups", "Token lookups, by result: hit (memory) or miss.", ["result"])


def exposition() -> tuple[bytes, str]:
    """The metrics in Prometheus's text format (every worker's, summed), and its content type."""
    if MULTIPROCESS_DIR in os.environ:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def forget_process(pid: int) -> None:
    """Drop a worker that died from the live gauges (its counters stay: what it served was served)."""
    if MULTIPROCESS_DIR in os.environ:
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


class _Series(dict[Key, Any]):
    """Labelled series, each looked up at its first count and then remembered: prometheus-client's own look-up
    costs more than the counting. Bounded: past 10,000, a look-up again, never a lost count."""

    def __init__(self, look_up: Callable[[Key], Any]) -> None:
        super().__init__()
        self._look_up = look_up

    def __missing__(self, key: Key) -> Any:
        if len(self) >= 10_000:
            self.clear()
        series = self[key] = self._look_up(key)
        return series


_requests_series = _Series[tuple[str, str, int]](
    lambda key: requests_total.labels(key[0], key[1], str(key[2]))  # project, provider, status
)
_duration_series = _Series[str](request_duration.labels)
_token_series = _Series[tuple[str, str]](
    lambda key: (tokens_total.labels(*key, "prompt"), tokens_total.labels(*key, "completion"))  # project, provider
)


class RequestCounts:
    """The counts of the proxied requests of one event loop (a gateway's). A turn's requests are counted together at
    its end (at 64 connections a turn brings about 20), each series once for them all: counted alone, a request's
    three counts, behind prometheus-client's checks and locks, took 27,600 instructions."""

    def __init__(self) -> None:
        self._served: list[tuple[str, str, int, float, float]] = []  # this turn's requests, not counted yet

    def served(self, project_id: str, provider: str, status: int, duration: float, overhead: float) -> None:
        """Count one proxied request, at the end of this turn (at once outside an event loop)."""
        self._served.append((project_id, provider, status, duration, overhead))
        if len(self._served) == 1:
            try:
                asyncio.get_running_loop().call_soon(self._count)
            except RuntimeError:
                self._count()

    def _count(self) -> None:
        served = self._served.copy()
        self._served.clear()
        if len(served) == 1:  # the turn brought one (a quiet gateway): no grouping
            project_id, provider, status, duration, overhead = served[0]
            _requests_series[project_id, provider, status].inc()
            _duration_series[provider].observe(duration)
            overhead_duration.observe(overhead)
            return
        requests: dict[tuple[str, str, int], int] = {}
        durations: dict[str, list[float]] = {}
        for project_id, provider, status, duration, _ in served:
            key = (project_id, provider, status)
            requests[key] = requests.get(key, 0) + 1
            durations.setdefault(provider, []).append(duration)
        for (project_id, provider, status), count in requests.items():
            _requests_series[project_id, provider, status].inc(count)
        for provider, amounts in durations.items():
            _observe_all(_duration_series[provider], amounts)
        _observe_all(overhead_duration, [overhead for *_, overhead in served])


def _observe_all(histogram: Histogram, amounts: list[float]) -> None:
    """`histogram.observe` of each amount, done as one count per bucket reached and one of the sum. What observe
    does for one amount: prometheus-client keeps each bucket's own count (the first whose bound is not below the
    amount), and adds them up as it collects them. Its attributes are private: tests/test_metrics.py compares
    the result with its own counting, so that a release that changes them fails the tests, not the counts."""
    reached: dict[int, int] = {}
    for amount in amounts:
        index = bisect.bisect_left(histogram._upper_bounds, amount)
        reached[index] = reached.get(index, 0) + 1
    for index, count in reached.items():
        histogram._buckets[index].inc(count)
    histogram._sum.inc(sum(amounts))


def tokens_counted(project_id: str, provider: str, prompt: int | None, completion: int | None) -> None:
    """Count the tokens a response reported."""
    prompts, completions = _token_series[project_id, provider]
    if prompt:
        prompts.inc(prompt)
    if completion:
        completions.inc(completion)
