"""The benchmark: the full gateway path against a direct call to the same upstream, side by side in one run.

    .venv/bin/python bench/run.py [--duration 10] [--soak 600] [--write]

The gateway (one process, one worker) is pinned to core 0; the upstream stand-in and wrk share core 1.
Reports requests/s and latency at 64 and 1 connections, the latency the gateway adds, the SSE
time-to-first-byte it adds, and its peak RSS. --soak runs load for that many seconds and samples the RSS;
--write stores the table in bench/RESULTS.md.
"""

import argparse
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import (
    BIN,
    CORES,
    GATEWAY_CORE,
    HERE,
    LOAD_CORE,
    add_bench_project,
    free_port,
    gateway_env,
    peak_rss_mb,
    pinned,
    rss_mb,
    store_section,
    wait_for_port,
)

LUA = """wrk.method = "POST"
wrk.body = '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello."}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
"""


def wrk(url: str, script: Path, connections: int, duration: int) -> dict[str, float]:
    output = subprocess.run(
        pinned(LOAD_CORE, ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(script), url]),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if "Non-2xx" in output or "Socket errors" in output:
        raise RuntimeError(f"wrk saw errors:\n{output}")

    def millis(label: str) -> float:
        match = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", output, re.M)
        if match is None:
            raise RuntimeError(f"no {label} in wrk output:\n{output}")
        return float(match.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[match.group(2)]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if rps is None:
        raise RuntimeError(f"no Requests/sec in wrk output:\n{output}")
    return {"rps": float(rps.group(1)), "p50": millis("50%"), "p99": millis("99%")}


def first_byte_ms(host_port: tuple[str, int], path: str, token: str, samples: int) -> float:
    """Median time from sending a request to reading the first byte of an SSE response."""
    request = f"GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    times = []
    for _ in range(samples):
        with socket.create_connection(host_port) as connection:
            started = time.perf_counter()
            connection.sendall(request.encode())
            received = connection.recv(65536)
            times.append((time.perf_counter() - started) * 1000)
            while not received.endswith(b"0\r\n\r\n"):  # the stream's last chunk
                more = connection.recv(65536)
                if not more:
                    break
                received += more
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--soak", type=int, default=0, help="also run load this many seconds, sampling RSS")
    parser.add_argument("--write", action="store_true", help="write bench/RESULTS.md")
    options = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("the benchmark needs wrk: apt-get install wrk")

    work = Path(tempfile.mkdtemp(prefix="credgate-bench-"))
    upstream_port, gateway_port = free_port(), free_port()
    env = gateway_env(work / "data")
    token = add_bench_project(env, upstream_port, ["POST chat/completions", "GET sse"])
    script = work / "post.lua"
    script.write_text(LUA % token)

    processes = [
        subprocess.Popen(
            pinned(LOAD_CORE, [sys.executable, str(HERE / "upstream.py"), str(upstream_port)]),
            stdout=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            pinned(GATEWAY_CORE, [str(BIN / "credgate"), "serve", "--port", str(gateway_port)]),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(work / "gateway.log").open("w"),
        ),
    ]
    try:
        wait_for_port(upstream_port)
        wait_for_port(gateway_port)
        gateway_pid = processes[1].pid
        direct_url = f"http://127.0.0.1:{upstream_port}/v1/chat/completions"
        gateway_url = f"http://127.0.0.1:{gateway_port}/proxy/openai/chat/completions"
        wrk(gateway_url, script, 64, 2)  # warm up: connections, caches
        rows = {}
        for connections in (64, 1):
            rows[f"direct c={connections}"] = wrk(direct_url, script, connections, options.duration)
            rows[f"gateway c={connections}"] = wrk(gateway_url, script, connections, options.duration)
        ttfb_direct = first_byte_ms(("127.0.0.1", upstream_port), "/v1/sse", token, 200)
        ttfb_gateway = first_byte_ms(("127.0.0.1", gateway_port), "/proxy/openai/sse", token, 200)
        peak = peak_rss_mb(gateway_pid)
        soak = []
        if options.soak:
            for _ in range(max(1, options.soak // 10)):
                wrk(gateway_url, script, 64, 10)
                soak.append(rss_mb(gateway_pid))
        report = render(rows, ttfb_direct, ttfb_gateway, peak, soak, options.duration)
        print(report)
        if options.write:
            store_section(report)
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


def render(
    rows: dict[str, dict[str, float]],
    ttfb_direct: float,
    ttfb_gateway: float,
    peak: float,
    soak: list[float],
    duration: int,
) -> str:
    lines = [
        "# credgate benchmark",
        "",
        f"`.venv/bin/python bench/run.py --duration {duration}{' --soak ' + str(len(soak) * 10) if soak else ''}`"
        f" on {CORES} cores, {time.strftime('%Y-%m-%d')}: gateway on core {GATEWAY_CORE}, upstream and wrk on core "
        f"{LOAD_CORE}; POST chat/completions through the full path (token, lookup, key injection, usage record).",
        "",
        "| run | requests/s | p50 ms | p99 ms |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {name} | {row['rps']:,.0f} | {row['p50']:.2f} | {row['p99']:.2f} |" for name, row in rows.items()]
    added = rows["gateway c=1"]["p50"] - rows["direct c=1"]["p50"]
    lines += [
        "",
        f"- added latency at 1 connection, p50: **{added:.2f} ms**",
        f"- SSE time to first byte: direct {ttfb_direct:.2f} ms, gateway {ttfb_gateway:.2f} ms, added "
        f"**{ttfb_gateway - ttfb_direct:.2f} ms** (median of 200, new connection each)",
        f"- gateway throughput at 64 connections: **{rows['gateway c=64']['rps']:,.0f} req/s** "
        f"({rows['gateway c=64']['rps'] / rows['direct c=64']['rps']:.0%} of direct)",
        f"- gateway peak RSS: **{peak:.0f} MB**",
    ]
    if soak:
        lines.append(f"- soak, RSS every 10 s under load (MB): {', '.join(f'{value:.0f}' for value in soak)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
