"""A worker's memory through its uses: what the proxy, /metrics, the admin API and the panel each add to it.

    .venv/bin/python bench/memory.py [--duration 5] [--write]

One `credgate serve` on SQLite (core 0; wrk and the stand-in upstream on core 1). Its RSS and peak RSS are read
in /proc after each step: started; proxy load (wrk, 64 connections); Prometheus-like scrapes of /metrics; proxy
load again; the admin API; the panel; proxy load again. A worker loads the admin API (FastAPI) and the panel
(Jinja2) at their first request only, and keeps them: a fleet's workers all end up having served them, so the
last step is what a worker of a long-running gateway holds. --write stores the table in bench/RESULTS.md.
"""

import argparse
import http.client
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import (
    BIN,
    GATEWAY_CORE,
    add_bench_project,
    credgate,
    credgate_revision,
    free_port,
    gateway_env,
    peak_rss_mb,
    pinned,
    require_wrk,
    rss_mb,
    start_upstream,
    store_section,
    wait_for_port,
)
from run import CHAT, LUA, wrk

GOAL_MB = 100


def get(port: int, path: str, token: str | None = None) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=5, help="seconds of each proxy load")
    parser.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    options = parser.parse_args()
    require_wrk()

    work = Path(tempfile.mkdtemp(prefix="credgate-memory-"))
    upstream_port, port = free_port(), free_port()
    env = gateway_env(work / "data")
    token = add_bench_project(env, upstream_port, ["POST chat/completions"])
    admin_token = credgate(env, "admin", "create-token", "--name", "memory").strip()
    script = work / "post.lua"
    script.write_text(LUA % token)
    upstream = start_upstream(upstream_port)
    serve = pinned(GATEWAY_CORE, [str(BIN / "credgate"), "serve", "--port", str(port)])
    gateway = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows: list[tuple[str, float, float]] = []

    def sample(step: str) -> None:
        time.sleep(1)  # the request log's last batch written
        rows.append((step, rss_mb(gateway.pid), peak_rss_mb(gateway.pid)))
        print(f"{step}: RSS {rows[-1][1]:.1f} MB, peak {rows[-1][2]:.1f} MB", flush=True)

    def proxy_load() -> None:
        wrk(f"http://127.0.0.1:{port}{CHAT}", script, 64, options.duration)

    try:
        wait_for_port(upstream_port)
        wait_for_port(port)
        sample("started")
        proxy_load()
        sample("proxy load")
        statuses = {get(port, "/metrics", admin_token) for _ in range(20)}
        sample("20 scrapes of /metrics")
        proxy_load()
        sample("proxy load again")
        statuses |= {get(port, path, admin_token) for path in ("/api/v1/projects", "/api/v1/templates")}
        sample("the admin API")
        statuses |= {get(port, path) for path in ("/admin/login", "/admin/setup")}
        sample("the panel")
        proxy_load()
        sample("proxy load, after all")
    finally:
        gateway.terminate()
        upstream.terminate()
        gateway.wait(10)
    if statuses - {200, 303, 404}:
        sys.exit(f"an unexpected answer among {sorted(statuses)}")
    shutil.rmtree(work, ignore_errors=True)
    report = render(rows, options.duration)
    print(report)
    if options.write:
        store_section(report)


def render(rows: list[tuple[str, float, float]], duration: int) -> str:
    by_step = {step: rss for step, rss, _ in rows}
    proxy_only = max(peak for step, _, peak in rows[:4])
    everything = rows[-1][2]
    added = {
        "/metrics": by_step["20 scrapes of /metrics"] - by_step["proxy load"],
        "the admin API": by_step["the admin API"] - by_step["proxy load again"],
        "the panel": by_step["the panel"] - by_step["the admin API"],
    }
    lines = [
        "# A worker's memory through its uses",
        "",
        f"`.venv/bin/python bench/memory.py --duration {duration}` on {credgate_revision()}, "
        f"{time.strftime('%Y-%m-%d')}: one `credgate serve` on SQLite, its RSS read in /proc after each step (proxy "
        f"load: wrk, 64 connections, {duration} s).",
        "",
        "| after | RSS MB | peak RSS MB |",
        "|---|---:|---:|",
        *(f"| {step} | {rss:.1f} | {peak:.1f} |" for step, rss, peak in rows),
        "",
        *(f"- {what} added {mb:.1f} MB" for what, mb in added.items()),
        f"- peak RSS serving the proxy and /metrics: {proxy_only:.1f} MB "
        f"({'within' if proxy_only <= GOAL_MB else 'over'} {GOAL_MB} MB)",
        f"- peak RSS once it has served the admin API and the panel too: {everything:.1f} MB "
        f"({'within' if everything <= GOAL_MB else 'over'} {GOAL_MB} MB)",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
