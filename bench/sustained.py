"""One worker under sustained full load: does its memory stay flat, and does the request log keep up?

    .venv/bin/python bench/sustained.py [--runs 8] [--duration 4] [--connections 64] [--database URL] [--write]

`credgate serve` (one worker, SQLite unless --database names another) serves the benchmark's POST
chat/completions from wrk, run after run with no pause; after each run the worker's RSS is read in /proc. At the
end, the requests wrk completed are compared with the request log's rows: a log that falls behind keeps its
pending records in memory (the RSS climbs) and, 20,000 behind, drops the oldest
(`credgate_request_records_dropped_total`). --write stores the table in bench/RESULTS.md.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import (
    BIN,
    HERE,
    add_bench_project,
    credgate,
    credgate_revision,
    free_port,
    gateway_env,
    peak_rss_mb,
    rss_mb,
    store_section,
    wait_for_port,
)
from run import CHAT, LUA, wrk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--duration", type=int, default=4, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--database", help="CREDGATE_DATABASE_URL (default: SQLite in a fresh data dir)")
    parser.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    options = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="credgate-sustained-"))
    upstream_port, port = free_port(), free_port()
    env = gateway_env(work / "data", **({"CREDGATE_DATABASE_URL": options.database} if options.database else {}))
    token = add_bench_project(env, upstream_port, ["POST chat/completions"])
    script = work / "post.lua"
    script.write_text(LUA % token)
    upstream = subprocess.Popen(
        [sys.executable, str(HERE / "upstream.py"), str(upstream_port)], stdout=subprocess.DEVNULL
    )
    gateway = subprocess.Popen(
        [str(BIN / "credgate"), "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    sent, rows = 0, []
    try:
        wait_for_port(upstream_port)
        wait_for_port(port)
        started = rss_mb(gateway.pid)
        for run in range(1, options.runs + 1):
            completed = int(
                wrk(f"http://127.0.0.1:{port}{CHAT}", script, options.connections, options.duration)["requests"]
            )
            sent += completed
            rows.append((run, sent, completed / options.duration, rss_mb(gateway.pid)))
        time.sleep(3)  # the last records reach the log
        peak = peak_rss_mb(gateway.pid)
    finally:
        gateway.terminate()
        upstream.terminate()
        gateway.wait()
        upstream.wait()
    recorded = request_log_rows(env)  # after the gateway's last flush

    database = "PostgreSQL" if options.database else "SQLite"
    lines = [
        "# Sustained load",
        "",
        f"`.venv/bin/python bench/sustained.py --runs {options.runs} --duration {options.duration} --connections "
        f"{options.connections}` on {credgate_revision()}, one worker on {database}, {time.strftime('%Y-%m-%d')}: "
        "wrk runs back to back, the worker's RSS read after each.",
        "",
        "| run | requests so far | requests/s | RSS MB |",
        "|---:|---:|---:|---:|",
        *(f"| {run} | {total:,} | {rate:,.0f} | {rss:.0f} |" for run, total, rate, rss in rows),
        "",
        f"- RSS {started:.0f} MB idle, {peak:.0f} MB at its peak; from the first run to the last "
        f"{rows[-1][3] - rows[0][3]:+.0f} MB",
        f"- request log: {recorded:,} rows for {sent:,} requests completed (wrk does not count the ones under way "
        "when it stops)",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if options.write:
        store_section(report)


def request_log_rows(env: dict[str, str]) -> int:
    """The requests in the request log of the one project there is (the benchmark's), through the CLI."""
    (project,) = json.loads(credgate(env, "projects", "list"))["items"]
    usage = json.loads(credgate(env, "projects", "usage", project["id"], "--days", "1"))
    return int(usage["totals"]["requests"])


if __name__ == "__main__":
    main()
