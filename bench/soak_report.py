"""The soak's verdict: criteria as PASS/FAIL lines, and the report as Markdown (printed, and stored in
bench/RESULTS.md by --write)."""

import math
import statistics
import time
from dataclasses import dataclass

from soak_observe import Sample

CLOSE_WITHIN_SECONDS = 1.0
TASKS_MARGIN = FDS_MARGIN = 5


@dataclass(frozen=True)
class Check:
    item: str  # the catalogue id the criterion comes from
    text: str
    passed: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'} {self.item}: {self.text} ({self.detail})"


@dataclass(frozen=True)
class Row:
    label: str
    sample: Sample


def leak_checks(item: str, baseline: Sample, sample: Sample, rss_limit_mib: float) -> list[Check]:
    """Tasks and fds back to baseline, no upstream connection answering, RSS within `rss_limit_mib`."""
    grown = sample.rss_mib - baseline.rss_mib
    return [
        Check(
            item,
            f"asyncio tasks = baseline ± {TASKS_MARGIN}",
            abs(sample.tasks - baseline.tasks) <= TASKS_MARGIN,
            f"{baseline.tasks} → {sample.tasks}",
        ),
        Check(
            item,
            f"open fds = baseline ± {FDS_MARGIN}, pooled upstream and database connections aside",
            abs(sample.own_fds - baseline.own_fds) <= FDS_MARGIN,
            f"{baseline.own_fds} → {sample.own_fds}; with them {baseline.fds} → {sample.fds}",
        ),
        Check(item, "active upstream connections = 0", sample.upstream_active == 0, f"{sample.upstream_active}"),
        Check(
            item,
            f"RSS within +{rss_limit_mib:g} MiB of baseline",
            grown <= rss_limit_mib,
            f"{baseline.rss_mib:.1f} → {sample.rss_mib:.1f} MiB, {grown:+.1f}",
        ),
    ]


def close_checks(item: str, delays: dict[str, float], peak_active: int) -> list[Check]:
    """Each client's departure closed its upstream connection within a second. `peak_active` (the most upstream
    responses under way at once) is told alongside: a stream goes on upstream until the gateway notices that its
    client left, so it may exceed the number of clients, by as much as the close delay allows."""
    if not delays:
        return []
    ordered = sorted(delays.values())
    late = sum(delay > CLOSE_WITHIN_SECONDS for delay in ordered)
    p99 = ordered[min(len(ordered) - 1, math.ceil(len(ordered) * 0.99) - 1)]
    detail = (
        f"{len(ordered) - late}/{len(ordered)} within; p50 {statistics.median(ordered) * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms; at most {peak_active} upstream responses at once"
    )
    text = f"upstream connection closed within {CLOSE_WITHIN_SECONDS:g} s of each client leaving mid-stream"
    return [Check(item, text, late == 0, detail)]


def render(
    *, command: str, setting: str, rows: list[Row], phases: list[str], checks: list[Check], seconds: float
) -> str:
    passed = all(check.passed for check in checks)
    lines = [
        "# Soak and leaks",
        "",
        f"`{command}` on {setting}, {time.strftime('%Y-%m-%d')}. The gateway is `credgate serve` on SQLite "
        "(bench/instrumented_serve.py adds a task-count probe on SIGUSR1); RSS and fds are read in /proc; the "
        "stand-in upstream counts the gateway's connections to it. The fds column leaves out the upstream "
        "connections the gateway's pool keeps idle for reuse (the next column has them): they are not leaks, and "
        "close 15 to 30 s after their last use.",
        "",
        "| checkpoint | RSS MiB | fds | fds with pooled | asyncio tasks | upstream open | upstream active |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        sample = row.sample
        lines.append(
            f"| {row.label} | {sample.rss_mib:.1f} | {sample.own_fds} | {sample.fds} | {sample.tasks} | "
            f"{sample.upstream_open} | {sample.upstream_active} |"
        )
    lines += ["", "Phases:", ""] + [f"- {phase}" for phase in phases]
    lines += ["", "Criteria:", ""] + [f"- {check.line()}" for check in checks]
    lines += ["", f"**{'PASS' if passed else 'FAIL'}**, total runtime {seconds:.0f} s"]
    return "\n".join(lines) + "\n"
