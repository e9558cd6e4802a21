"""The benchmarks' harness: loopback ports, core pinning, the `credgate` CLI, a data dir with a project whose
`openai` integration points at a local stand-in upstream, the gateway process as /proc shows it, and the
sections of bench/RESULTS.md."""

import http.client
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
RESULTS = HERE / "RESULTS.md"
BIN = Path(sys.executable).parent
CORES = os.cpu_count() or 1
GATEWAY_CORE, LOAD_CORE = ("0", "1") if CORES >= 2 else ("0", "0")
KEY = "sk-bench-not-a-real-key-000000000000"
PROBE_PREFIX = "credgate-bench-probe "  # bench/instrumented_serve.py's report line


def require_wrk() -> None:
    if not shutil.which("wrk"):
        sys.exit("the benchmark needs wrk: apt-get install wrk")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pinned(core: str, command: list[str]) -> list[str]:
    return ["taskset", "-c", core, *command] if shutil.which("taskset") else command


def pin_this_process(core: str) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(core)})


# A fixed piece of pure Python work: the time it takes tells how fast a core of this host runs at the moment.
_SPEED_PROBE = """import time
started = time.perf_counter()
total = 0
for number in range(2_000_000):
    total += number * number % 7
print(time.perf_counter() - started)"""


def probe_ms(cores: list[str]) -> list[float]:
    """The time in ms a fixed Python loop takes on each of `cores`, run on all of them at once: how fast the host's
    cores run at the moment, alone or busy together (a virtual machine's cores may share a physical one)."""
    probes = [
        subprocess.Popen(pinned(core, [sys.executable, "-c", _SPEED_PROBE]), stdout=subprocess.PIPE, text=True)
        for core in cores
    ]
    return [float(probe.communicate()[0]) * 1000 for probe in probes]


def start_upstream(port: int) -> "subprocess.Popen[bytes]":
    """The stand-in upstream (bench/upstream.py) on `port`, pinned to the load's core."""
    command = pinned(LOAD_CORE, [sys.executable, str(HERE / "upstream.py"), str(port)])
    return subprocess.Popen(command, stdout=subprocess.DEVNULL)


def wait_for_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def credgate(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(BIN / "credgate"), *args], env=env, input=stdin, capture_output=True, text=True, check=True
    )
    return result.stdout


def gateway_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The gateway's environment: a fresh data dir, loopback upstreams allowed, nothing of the test suite's."""
    env = {**os.environ, "CREDGATE_DATA_DIR": str(data_dir), "CREDGATE_ALLOW_PRIVATE_UPSTREAMS": "true", **extra}
    return {name: value for name, value in env.items() if not name.startswith("CREDGATE_TEST_")}


def own_data_dir(env: dict[str, str], into: Path) -> dict[str, str]:
    """`env` with a copy of its data dir (projects, tokens, keys) at `into`: a gateway of its own database, so that
    none stopped by the benchmark holds a lock another gateway needs."""
    shutil.copytree(env["CREDGATE_DATA_DIR"], into)
    return {**env, "CREDGATE_DATA_DIR": str(into)}


def add_bench_project(
    env: dict[str, str],
    upstream_port: int,
    endpoints: list[str],
    *,
    rate_limit: int | None = None,
    budgets: bool = False,
    max_concurrent: int | None = None,
) -> str:
    """Create the project `bench` with an `openai` integration at the stand-in upstream (and `rate_limit` requests
    a minute, or a cap of `max_concurrent` requests under way, if given; with `budgets`, a requests, a tokens and a
    cost budget far above the load, and a price list); returns its token."""
    project = json.loads(credgate(env, "projects", "create", "bench"))
    project_id, token = project["project"]["id"], project["secret"]
    if rate_limit is not None:
        credgate(env, "projects", "update", project_id, "--rate-limit", str(rate_limit))
    if max_concurrent is not None:
        credgate(env, "projects", "update", project_id, "--max-concurrent", str(max_concurrent))
    credgate(
        env,
        "integrations",
        "add",
        project_id,
        "openai",
        "--template",
        "openai-chat-completions",
        "--base-url",
        f"http://127.0.0.1:{upstream_port}/v1",
        "--api-key-stdin",
        stdin=KEY,
    )
    credgate(env, "integrations", "set-endpoints", project_id, "openai", *endpoints)
    if budgets:
        credgate(env, "integrations", "set-prices", project_id, "openai", "gpt-4o-mini*=0.15,0.6", "*=2.5,10")
        for metric, limit in (("requests", "1e12"), ("tokens", "1e15"), ("cost", "1e9")):
            credgate(env, "budgets", "add", project_id, "--metric", metric, "--limit", limit, "--period", "month")
    return str(token)


def admin_api(port: int, admin_token: str, method: str, path: str, body: Mapping[str, object]) -> dict[str, Any]:
    """One call of the gateway's admin API; raises unless it answers 2xx."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"}
        connection.request(method, f"/api/v1{path}", json.dumps(body), headers)
        response = connection.getresponse()
        answer = response.read()
    finally:
        connection.close()
    if not 200 <= response.status < 300:
        raise RuntimeError(f"{method} {path}: {response.status} {answer[:300]!r}")
    result: dict[str, Any] = json.loads(answer)
    return result


def add_bench_project_over_api(port: int, admin_token: str, upstream_port: int, endpoints: list[str]) -> str:
    """add_bench_project through a running gateway's admin API, which costs no CLI start-ups."""
    project = admin_api(port, admin_token, "POST", "/projects", {"name": "bench"})
    project_id, token = project["project"]["id"], project["secret"]
    integration = {
        "provider": "openai",
        "template": "openai-chat-completions",
        "base_url": f"http://127.0.0.1:{upstream_port}/v1",
        "api_key": KEY,
    }
    admin_api(port, admin_token, "POST", f"/projects/{project_id}/integrations", integration)
    allowed = [dict(zip(("method", "path"), endpoint.split(" ", 1), strict=True)) for endpoint in endpoints]
    admin_api(port, admin_token, "PUT", f"/projects/{project_id}/integrations/openai/endpoints", {"endpoints": allowed})
    return str(token)


def credgate_revision() -> str:
    """Which credgate the gateway runs (the one this interpreter would import): its commit, and whether its
    source differs from it."""
    spec = importlib.util.find_spec("credgate")
    if spec is None or spec.origin is None:
        return "credgate (not found)"
    where = str(Path(spec.origin).parent)
    try:
        commit = subprocess.run(
            ["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", where, "status", "--porcelain", "--", "."], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"credgate from {where}"
    return f"credgate {commit}" + (" with uncommitted changes" if changed else "")


def peak_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def cpu_seconds(pid: int) -> float:
    """The CPU time a process has used so far, user and system (/proc/PID/stat's utime and stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def database_fds(pid: int) -> int:
    """The fds on the SQLite database's files (the file, its WAL and shared memory): the connection pool's, which
    opens a connection more when work overlaps and keeps it for reuse, like the upstream pool."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        count += target.rsplit("/", 1)[-1] in ("credgate.db", "credgate.db-wal", "credgate.db-shm")
    return count


def store_section(text: str, path: Path = RESULTS) -> None:
    """Put `text`, a section that starts with a `# ` heading, into the results file: in place of the section of
    the same heading if there is one, else at the end. Other sections are kept."""
    heading = text.splitlines()[0]
    sections = re.split(r"(?m)^(?=# )", path.read_text()) if path.exists() else []
    kept = [section for section in sections if section.strip()]
    for index, section in enumerate(kept):
        if section.splitlines()[0] == heading:
            kept[index] = text
            break
    else:
        kept.append(text)
    path.write_text("\n".join(section.rstrip("\n") + "\n" for section in kept))
