"""The metrics of a worker (PROMETHEUS_MULTIPROC_DIR set): counted into files named by its process id, which it
knows without asking the kernel at each count, and learns anew in a forked child."""

import json
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

_WORKER = """
import json, os, sys
from credgate import metrics

asked = []
sys.setprofile(lambda frame, event, arg: asked.append(1) if event == "c_call" and arg is os.getpid else None)
metrics.request_served("p1", "openai", 200, 0.01, 0.001)
metrics.tokens_counted("p1", "openai", 3, 4)
sys.setprofile(None)
counted_asking = len(asked)
child = os.fork()
if child == 0:
    metrics.request_served("p1", "openai", 200, 0.01, 0.001)
    metrics.request_served("p1", "openai", 200, 0.01, 0.001)
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
