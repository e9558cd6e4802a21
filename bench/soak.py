"""The soak and leak check: the gateway on loopback through client disconnects, error storms and a long mixed
load, its RSS, open fds and asyncio tasks compared after each with a baseline, against the reliability
catalogue's criteria FT-07, LS-06 and a bounded LS-05.

    .venv/bin/python bench/soak.py [--disconnects 1000] [--requests 100000] [--concurrency 20] [--quick] [--write]

The gateway runs as `credgate serve` runs it (bench/instrumented_serve.py adds only a task-count probe), on
SQLite in a temporary data dir, pinned to core 0; the stand-in upstream (bench/soak_upstream.py) and this
client share core 1. Every loop is bounded in count and time, and all traffic stays on 127.0.0.1. The baseline
is taken after a warm-up: caches, pools and objects built on first use are not leaks. Then, in order:

1. FT-07: clients leave an endless stream after three events, `--concurrency` at a time (every 4th with a
   reset instead of a FIN). Each upstream connection must close within 1 s of its client leaving; within 5 s
   of the last, tasks and fds must be back to baseline ± 5, no upstream connection active, RSS within +5 MiB;
   then 100 normal requests must succeed.
2. LS-06: streamed upstream 429s in a row, then 1,000 normal requests, which must succeed: no pool
   exhaustion, upstream connections never more active than the clients, and FT-07's bounds after it.
3. LS-05, bounded: the mixed soak (streamed SSE 45 %, plain JSON 25 %, upstream 429, 500 and streamed 429 5 %
   each, auth failures with new random tokens 10 %, mid-stream disconnects 5 %). Every answer must be the
   expected one; within 5 s after it tasks and fds are back to baseline ± 5 and RSS has grown by at most
   50 MiB; after an idle period RSS is within 10 % of the baseline and the pool's idle connections have closed.

Prints the samples and one PASS or FAIL line per criterion; exits 1 when one fails (the work dir with the
gateway's log is then kept). --write stores the report in bench/RESULTS.md.
"""

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from harness import (
    CORES,
    GATEWAY_CORE,
    HERE,
    LOAD_CORE,
    add_bench_project_over_api,
    credgate,
    credgate_revision,
    free_port,
    gateway_env,
    pin_this_process,
    pinned,
    rss_mb,
    store_section,
)
from soak_client import ENDPOINTS, JSON, SSE, STREAMED_429
from soak_load import LEAVE, MIX, Load, Pick, Tally
from soak_observe import Observer, Sample
from soak_report import Check, Row, close_checks, leak_checks, render

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
    uvloop = None  # type: ignore[assignment]

SETTLE_SECONDS = 5.0
RSS_TRACE_SECONDS = 20.0
# credgate's upstream client closes an idle connection once it has been idle 15 s (KEEP_ALIVE_SECONDS), at a sweep
# it runs every 15 s: so 15 to 30 s after its last use, and one second more for the sweep's rounding.
POOL_DRAINED_SECONDS = 2 * 15.0 + 1


@dataclass(frozen=True)
class Plan:
    disconnects: int = 1000
    requests: int = 100_000
    concurrency: int = 20
    storm: int = 1000  # streamed upstream 429s in a row
    after_disconnects: int = 100
    after_storm: int = 1000
    warmup: int = 2000
    idle_seconds: float = 35.0
    time_limit_seconds: float = 1800.0


QUICK = Plan(disconnects=40, requests=1000, storm=40, after_storm=100, warmup=200, idle_seconds=1.0)


async def soak(plan: Plan, work: Path) -> "Phases":
    upstream_port, control_port, gateway_port = free_port(), free_port(), free_port()
    env = gateway_env(work / "data")
    # One CLI start-up (it also creates the database and the master key, before the gateway opens them); the
    # rest of the set-up goes through the admin API.
    admin_token = (await asyncio.to_thread(credgate, env, "admin", "create-token", "--name", "soak")).strip()
    upstream = await asyncio.create_subprocess_exec(
        *pinned(LOAD_CORE, [sys.executable, str(HERE / "soak_upstream.py"), str(upstream_port), str(control_port)]),
        stdout=subprocess.DEVNULL,
    )
    serve = [sys.executable, str(HERE / "instrumented_serve.py"), "serve", "--port", str(gateway_port)]
    with (work / "gateway.log").open("wb") as log:
        gateway = await asyncio.create_subprocess_exec(
            *pinned(GATEWAY_CORE, serve),
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    try:
        for port in (upstream_port, control_port, gateway_port):
            await listening(port, (upstream, gateway), work / "gateway.log")
        token = await asyncio.to_thread(add_bench_project_over_api, gateway_port, admin_token, upstream_port, ENDPOINTS)
        observer = Observer(gateway, control_port)
        load = Load(gateway_port, token, plan.concurrency)
        phases = Phases(plan, load, observer)
        baseline = await phases.warm_up()
        await phases.disconnects(baseline)
        await phases.error_storm(baseline)
        await phases.mixed_load(baseline, work / "gateway.log")
        return phases
    finally:
        for process in (gateway, upstream):
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


class Phases:
    """The soak's phases, in order, each adding its samples, tallies and criteria."""

    def __init__(self, plan: Plan, load: Load, observer: Observer) -> None:
        self.plan = plan
        self.load = load
        self.observer = observer
        self.rows: list[Row] = []
        self.tallies: list[Tally] = []
        self.checks: list[Check] = []
        self.notes: list[str] = []

    async def run(self, label: str, count: int, pick: Pick) -> Tally:
        tally = await self.load.run(label, count, pick)
        self.tallies.append(tally)
        print(f"{label}: {tally.summary()}", flush=True)
        return tally

    async def warm_up(self) -> Sample:
        await self.run("warm-up", self.plan.warmup, lambda index: MIX[index % len(MIX)])
        await self.observer.settle(lambda sample: sample.upstream_active == 0, SETTLE_SECONDS)
        await asyncio.sleep(0.5)
        baseline = await self.observer.sample()
        self.rows.append(Row(f"baseline, after a warm-up of {self.plan.warmup:,} mixed requests", baseline))
        return baseline

    async def settled(self, baseline: Sample, item: str, label: str, rss_limit: float) -> None:
        """Sample until the leak criteria hold, for at most SETTLE_SECONDS, and judge the last sample."""

        def holds(sample: Sample) -> bool:
            return all(check.passed for check in leak_checks(item, baseline, sample, rss_limit))

        sample, elapsed = await self.observer.settle(holds, SETTLE_SECONDS)
        self.rows.append(Row(f"{label}, +{elapsed:.1f} s", sample))
        self.checks.extend(leak_checks(item, baseline, sample, rss_limit))

    async def departures_judged(self, item: str, tally: Tally) -> None:
        closes = await self.observer.closes(tally.left_at, SETTLE_SECONDS)
        self.checks.extend(close_checks(item, closes, (await self.observer.upstream())["peak_active"]))

    async def disconnects(self, baseline: Sample) -> None:
        """FT-07."""
        plan = self.plan
        await self.observer.upstream("reset")
        left = await self.run(f"FT-07 {plan.disconnects:,} mid-stream disconnects", plan.disconnects, lambda i: LEAVE)
        self.checks.append(left.check("FT-07", "every client read three events of its stream, then left"))
        await self.departures_judged("FT-07", left)
        await self.settled(baseline, "FT-07", f"FT-07 after {plan.disconnects:,} disconnects", 5.0)
        after = await self.run("FT-07 next normal requests", plan.after_disconnects, lambda index: JSON)
        self.checks.append(after.check("FT-07", f"the next {plan.after_disconnects} normal requests succeed"))

    async def error_storm(self, baseline: Sample) -> None:
        """LS-06."""
        plan = self.plan
        await self.observer.upstream("reset")
        storm = await self.run(f"LS-06 {plan.storm:,} streamed upstream 429s", plan.storm, lambda i: STREAMED_429)
        self.checks.append(storm.check("LS-06", f"{plan.storm:,} streamed upstream 429s in a row relayed unchanged"))
        after = await self.run("LS-06 next normal requests", plan.after_storm, lambda index: (JSON, SSE)[index % 2])
        self.checks.append(after.check("LS-06", f"the next {plan.after_storm:,} requests succeed (no pool exhaustion)"))
        # Each client has one request at a time: an upstream connection still answering after its client's response
        # ended would show as more.
        peak = (await self.observer.upstream())["peak_active"]
        text = f"active upstream connections never above the {plan.concurrency} clients"
        self.checks.append(Check("LS-06", text, peak <= plan.concurrency, f"peak {peak}"))
        await self.settled(baseline, "LS-06", "LS-06 after the storm", 5.0)

    async def trace_rss(self, trace: list[float]) -> None:
        while True:
            await asyncio.sleep(RSS_TRACE_SECONDS)
            trace.append(rss_mb(self.observer.gateway.pid))

    async def mixed_load(self, baseline: Sample, log: Path) -> None:
        """LS-05, bounded."""
        plan = self.plan
        await self.observer.upstream("reset")
        trace: list[float] = []
        tracer = asyncio.create_task(self.trace_rss(trace))
        try:
            mixed = await self.run(
                f"LS-05 {plan.requests:,} mixed requests", plan.requests, lambda i: MIX[i % len(MIX)]
            )
        finally:
            tracer.cancel()
        if trace:
            values = ", ".join(f"{value:.1f}" for value in trace)
            self.notes.append(f"LS-05 RSS every {RSS_TRACE_SECONDS:g} s under load (MiB): {values}")
        self.checks.append(mixed.check("LS-05", "every answer as expected (relayed upstream errors included)"))
        await self.departures_judged("LS-05", mixed)
        await self.settled(baseline, "LS-05", f"LS-05 after {plan.requests:,} requests", 50.0)
        await asyncio.sleep(plan.idle_seconds)
        idle = await self.observer.sample()
        self.rows.append(Row(f"LS-05 after {plan.idle_seconds:g} s idle", idle))
        self.checks.append(
            Check(
                "LS-05",
                f"RSS after {plan.idle_seconds:g} s idle within 10 % of baseline",
                idle.rss_mib <= baseline.rss_mib * 1.10,
                f"{baseline.rss_mib:.1f} → {idle.rss_mib:.1f} MiB",
            )
        )
        if plan.idle_seconds > POOL_DRAINED_SECONDS:
            text = f"the pool's idle upstream connections all closed after {plan.idle_seconds:g} s idle (15-30 s)"
            self.checks.append(Check("LS-05", text, idle.upstream_open == 0, f"{idle.upstream_open} open"))
        lines = await asyncio.to_thread(log_lines, log)
        errors = [line for line in lines if " ERROR " in line or "Traceback" in line]
        detail = errors[0][:160] if errors else "0 lines"
        self.checks.append(Check("LS-05", "no error in the gateway's log", not errors, detail))


async def listening(port: int, processes: tuple[asyncio.subprocess.Process, ...], log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline or any(process.returncode is not None for process in processes):
                raise RuntimeError(f"nothing listens on {port}; see {log}") from None
            await asyncio.sleep(0.05)
        else:
            writer.close()
            return


def log_lines(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--disconnects", type=int, help=f"mid-stream disconnects (default {Plan.disconnects})")
    parser.add_argument("--requests", type=int, help=f"mixed requests of the soak (default {Plan.requests})")
    parser.add_argument("--concurrency", type=int, help=f"concurrent clients (default {Plan.concurrency})")
    parser.add_argument("--quick", action="store_true", help="small numbers, for a smoke run of a few seconds")
    parser.add_argument("--write", action="store_true", help="store the report in bench/RESULTS.md")
    options = parser.parse_args()
    plan = QUICK if options.quick else Plan()
    given = {name: getattr(options, name) for name in ("disconnects", "requests", "concurrency")}
    plan = replace(plan, **{name: value for name, value in given.items() if value is not None})
    if min(plan.disconnects, plan.requests, plan.concurrency) < 1:
        sys.exit("--disconnects, --requests and --concurrency must be at least 1")

    pin_this_process(LOAD_CORE)
    work = Path(tempfile.mkdtemp(prefix="credgate-soak-"))
    started = time.monotonic()

    async def bounded() -> Phases:
        # A signal cancels the run, so that the gateway and the upstream are stopped on the way out.
        task = asyncio.current_task()
        if task is not None:
            for signum in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(signum, task.cancel)
        async with asyncio.timeout(plan.time_limit_seconds):
            return await soak(plan, work)

    try:
        phases = (uvloop.run if uvloop else asyncio.run)(bounded())
    except (asyncio.CancelledError, TimeoutError) as stopped:
        reason = "interrupted" if isinstance(stopped, asyncio.CancelledError) else "over the time limit"
        sys.exit(f"soak {reason}; the gateway's log is in {work}")
    command = " ".join(["bench/soak.py", *(arg for arg in sys.argv[1:] if arg != "--write")])
    report = render(
        command=f".venv/bin/python {command}",
        setting=f"{credgate_revision()}, {CORES} cores: gateway on core {GATEWAY_CORE}, stand-in upstream and "
        f"client on core {LOAD_CORE}; {plan.concurrency} concurrent clients",
        rows=phases.rows,
        phases=[f"{tally.label}: {tally.summary()}" for tally in phases.tallies] + phases.notes,
        checks=phases.checks,
        seconds=time.monotonic() - started,
    )
    print(report)
    if options.write:
        store_section(report)
    if all(check.passed for check in phases.checks):
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"some criteria failed; the gateway's log is in {work}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
