"""The metrics of a worker (PROMETHEUS_MULTIPROC_DIR set): counted into files named by its process id, which it
knows without asking the kernel at each count, and learns anew in a forked child. The requests of an event-loop
turn: counted together at its end, exactly as prometheus-client counts each."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from credgate import metrics

_WORKER = """
import json, os, sys
from credgate import metrics

asked = []
counts = metrics.RequestCounts()  # outside an event loop: counted at once
sys.setprofile(lambda frame, event, arg: asked.append(1) if event == "c_call" and arg is os.getpid else None)
counts.served("p1", "openai", 200, 0.01, 0.001)
metrics.tokens_counted("p1", "openai", 3, 4)
sys.setprofile(None)
counted_asking = len(asked)
child = os.fork()
if child == 0:
    counts.served("p1", "openai", 200, 0.01, 0.001)
    counts.served("p1", "openai", 200, 0.01, 0.001)
    os._exit(0)
os.waitpid(child, 0)
print(json.dumps({"parent": os.getpid(), "child": child, "counted_asking": counted_asking}))
"""


def _requests_counted(metrics_dir: Path) -> float | None:
    """credgate_requests as /metrics sums it over the processes' files."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, str(metrics_dir))  # type: ignore[no-untyped-call]
    return registry.get_sample_value(
        "credgate_requests_total", {"project": "p1", "provider": "openai", "status": "200"}
    )


def test_a_worker_counts_into_its_own_file_without_asking_its_process_id_and_a_fork_into_the_childs(
    tmp_path: Path,
) -> None:
    answer = subprocess.run(
        [sys.executable, "-c", _WORKER],
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(answer.stdout)
    assert seen["counted_asking"] == 0
    # Each process's own file: a child writing into its parent's would race it for the same slots.
    assert {path.name for path in tmp_path.glob("counter_*.db")} == {
        f"counter_{seen['parent']}.db",
        f"counter_{seen['child']}.db",
    }
    assert _requests_counted(tmp_path) == 3


def _samples(registry: CollectorRegistry, prefix: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name.startswith(prefix) and not sample.name.endswith("_created")
    }


def _counted_in_one_turn(served: list[tuple[str, str, int, float, float]]) -> dict[str, Any]:
    """What the process's registry gained from `served`, all counted in one event-loop turn, and whether any of it
    showed before the turn ended."""
    before = _samples(REGISTRY, "credgate_")

    async def one_turn() -> bool:
        counts = metrics.RequestCounts()
        for request in served:
            counts.served(*request)
        shown_early = _samples(REGISTRY, "credgate_") != before
        await asyncio.sleep(0)
        return shown_early

    shown_early = asyncio.run(one_turn())
    after = _samples(REGISTRY, "credgate_")
    return {"shown_early": shown_early, "gained": {key: after[key] - before.get(key, 0) for key in after}}


def _observed_one_by_one(served: list[tuple[str, str, int, float, float]]) -> dict[Any, float]:
    """The same requests counted by prometheus-client itself, each on its own, in a registry of their own."""
    registry = CollectorRegistry()
    requests = Counter("credgate_requests", "", ["project", "provider", "status"], registry=registry)
    durations = Histogram(
        "credgate_request_duration_seconds", "", ["provider"], buckets=metrics._SECONDS, registry=registry
    )
    overheads = Histogram("credgate_overhead_duration_seconds", "", buckets=metrics._SECONDS[:10], registry=registry)
    for project_id, provider, status, duration, overhead in served:
        requests.labels(project_id, provider, str(status)).inc()
        durations.labels(provider).observe(duration)
        overheads.observe(overhead)
    return _samples(registry, "credgate_")


_BOUNDS = st.sampled_from([*metrics._SECONDS, 0.0])  # exactly on a bucket's bound: counted in that bucket
_SECONDS = st.floats(min_value=0, max_value=400, allow_nan=False) | _BOUNDS
_REQUEST = st.tuples(
    st.sampled_from(["p-counted-1", "p-counted-2"]),
    st.sampled_from(["openai", "anthropic", "-"]),
    st.sampled_from([200, 404, 502]),
    _SECONDS,
    _SECONDS,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_REQUEST, min_size=1, max_size=40))
def test_the_requests_of_a_turn_are_counted_at_its_end_as_prometheus_client_counts_each(
    served: list[tuple[str, str, int, float, float]],
) -> None:
    """Counted together, at the end of the turn: every count, bucket and sum as observing each request gives."""
    counted = _counted_in_one_turn(served)
    expected = _observed_one_by_one(served)
    assert counted["shown_early"] is False
    gained = counted["gained"]
    for key in expected.keys() | gained.keys():
        assert gained.get(key, 0) == pytest.approx(expected.get(key, 0), rel=1e-9, abs=1e-9), key
