"""Instructions a request, end to end, counted by valgrind's callgrind: the same count whatever else the machine is
doing, so that a change of 1% shows where requests/s, on a noisy host, cannot tell it from the noise.

    .venv/bin/python bench/instructions.py [--seconds 20] [--bare] [REVISION ...]

Each system serves the benchmark's POST chat/completions under callgrind, pinned to one core, while wrk drives it
at 16 connections from the other; after a warm-up the count is zeroed, wrk runs `--seconds`, and the instructions
of every thread of the process are divided by the requests. Counted: the working tree's credgate, each REVISION's
(a git revision, checked out in a temporary worktree whose `src` comes first on PYTHONPATH), and with `--bare` the
bare reference proxy. Under valgrind a gateway serves about 100 requests a second, so its request log's batches
are a few rows, not the hundreds of real load, and its event-loop turns bring fewer requests: compare counts with
counts, not with the benchmark's CPU times. The same tree counted three times gave 850,594, 850,615 and 852,233.
Needs valgrind and wrk. About a minute a system.
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import (
    BIN,
    GATEWAY_CORE,
    HERE,
    KEY,
    LOAD_CORE,
    add_bench_project,
    free_port,
    gateway_env,
    pinned,
    start_upstream,
    wait_for_port,
)
from run import LUA

CONNECTIONS = 16
WARM_UP_SECONDS = 4
_TOTAL = re.compile(r"^(?:summary|totals):\s+(\d+)", re.M)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revisions", nargs="*", help="git revisions to count beside the working tree")
    parser.add_argument("--seconds", type=int, default=20, help="seconds of measured load per system")
    parser.add_argument("--bare", action="store_true", help="count the bare reference proxy too")
    options = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "wrk"):
        if not shutil.which(tool):
            sys.exit(f"bench/instructions.py needs {tool} (apt-get install valgrind wrk)")

    work = Path(tempfile.mkdtemp(prefix="credgate-instructions-"))
    upstream_port = free_port()
    env = gateway_env(work / "data", PYTHONHASHSEED="0")  # the same dict layouts, run after run
    token = add_bench_project(env, upstream_port, ["POST chat/completions"])
    script = work / "post.lua"
    script.write_text(LUA % token)
    upstream = start_upstream(upstream_port)
    worktrees: list[Path] = []
    try:
        wait_for_port(upstream_port)
        systems: list[tuple[str, list[str], dict[str, str]]] = []
        if options.bare:
            upstream_url = f"http://127.0.0.1:{upstream_port}/v1"
            bare = [sys.executable, str(HERE / "bare_proxy.py"), "{port}", upstream_url, token, KEY]
            systems.append(("bare proxy", bare, env))
        serve = [str(BIN / "credgate"), "serve", "--port", "{port}"]
        systems.append(("credgate, working tree", serve, env))
        for revision in options.revisions:
            tree = work / f"tree-{len(worktrees)}"
            subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", str(tree), revision], check=True)
            worktrees.append(tree)
            systems.append((f"credgate {revision}", serve, {**env, "PYTHONPATH": str(tree / "src")}))
        for name, command, system_env in systems:
            requests, instructions = count(command, system_env, script, work, options.seconds)
            print(f"{name}: {instructions / requests:,.0f} instructions a request ({requests} requests)", flush=True)
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)
        for tree in worktrees:
            subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(work, ignore_errors=True)


def count(command: list[str], env: dict[str, str], script: Path, work: Path, seconds: int) -> tuple[int, int]:
    """The requests that `seconds` of load completed through `command` ("{port}" in it is its port), and the
    instructions its process ran meanwhile."""
    port = free_port()
    out = work / f"callgrind-{port}.out"
    valgrind = ["valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={out}"]
    process = subprocess.Popen(
        pinned(GATEWAY_CORE, [*valgrind, *(part.replace("{port}", str(port)) for part in command)]),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/proxy/openai/chat/completions"

    def load(duration: int) -> str:
        wrk = ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{duration}s", "--timeout", "60s", "-s", str(script), url]
        return subprocess.run(pinned(LOAD_CORE, wrk), capture_output=True, text=True, check=True).stdout

    try:
        wait_for_port(port, timeout=240)  # a start under valgrind takes a while
        load(WARM_UP_SECONDS)
        subprocess.run(["callgrind_control", "--zero", str(process.pid)], capture_output=True, check=True)
        measured = load(seconds)
        subprocess.run(["callgrind_control", "--dump=measured", str(process.pid)], capture_output=True, check=True)
        time.sleep(2)  # each thread's part is written as it comes to a stop
    finally:
        process.terminate()
        process.wait(timeout=120)
    if "Non-2xx" in measured or "Socket errors" in measured:
        raise RuntimeError(f"wrk saw errors:\n{measured}")
    completed = re.search(r"(\d+) requests in", measured)
    if completed is None:
        raise RuntimeError(f"no request count in wrk output:\n{measured}")
    for path in work.glob(f"{out.name}.*"):  # the dump asked for (the one at exit is `out` itself)
        dump = path.read_text(errors="replace")
        total = _TOTAL.search(dump)
        if "measured" in dump[:3000] and total is not None:
            return int(completed.group(1)), int(total.group(1))
    raise RuntimeError(f"no dump of the measured load in {work}")


if __name__ == "__main__":
    main()
