"""Where one credgate worker spends its time under load: py-spy samples it while wrk drives the benchmark's
request through it.

    .venv/bin/python bench/profile.py [--duration 15] [--top 40] [--stacks stacks.txt]

Prints, for the frames that matter, the share of samples in which each appears (inclusive), heaviest first, and
the share of the samples spent in each function itself. Needs wrk and py-spy (`pip install py-spy`).
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=15)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--stacks", type=Path, help="also keep py-spy's collapsed stacks here (for flamegraph.pl)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--bare", action="store_true", help="profile the bare reference proxy instead")
    parser.add_argument("--all-threads", action="store_true", help="also sample threads not holding the GIL")
    options = parser.parse_args()
    for tool in ("wrk", "py-spy"):
        if not shutil.which(tool) and not (BIN / tool).exists():
            sys.exit(f"the profile needs {tool}")
    py_spy = str(BIN / "py-spy") if (BIN / "py-spy").exists() else "py-spy"

    work = Path(tempfile.mkdtemp(prefix="credgate-profile-"))
    upstream_port, gateway_port = free_port(), free_port()
    env = gateway_env(work / "data")
    token = add_bench_project(env, upstream_port, ["POST chat/completions"])
    script = work / "post.lua"
    script.write_text(LUA % token)
    upstream = start_upstream(upstream_port)
    if options.bare:
        upstream_url = f"http://127.0.0.1:{upstream_port}/v1"
        serve = [sys.executable, str(HERE / "bare_proxy.py"), str(gateway_port), upstream_url, token, KEY]
    else:
        serve = [str(BIN / "credgate"), "serve", "--port", str(gateway_port)]
    gateway = subprocess.Popen(
        pinned(GATEWAY_CORE, serve),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(upstream_port)
        wait_for_port(gateway_port)
        url = f"http://127.0.0.1:{gateway_port}/proxy/openai/chat/completions"
        load = ["wrk", "-t1", f"-c{options.connections}", f"-d{options.duration + 3}s", "-s", str(script), url]
        wrk = subprocess.Popen(pinned(LOAD_CORE, load), stdout=subprocess.PIPE, text=True)
        raw = work / "stacks.txt"
        # Without pausing the process: a paused thread stops where a system call returns, so a blocking sample
        # lands on every os.getpid() or socket write far more often than the time spent there.
        record = [py_spy, "record", "--pid", str(gateway.pid), "--duration", str(options.duration), "--rate", "200"]
        record.append("--nonblocking")
        if not options.all_threads:
            record.append("--gil")  # what holds the interpreter is what one worker's throughput is made of
        subprocess.run(pinned(LOAD_CORE, [*record, "--format", "raw", "--output", str(raw)]), check=True)
        print(wrk.communicate()[0])
        print(summarise(raw.read_text(), options.top))
        if options.stacks:
            shutil.copy(raw, options.stacks)
    finally:
        for process in (gateway, upstream):
            process.terminate()
            process.wait(timeout=40)
        shutil.rmtree(work, ignore_errors=True)


def summarise(collapsed: str, top: int) -> str:
    """Inclusive and own shares per function, from py-spy's collapsed stacks ("frame;frame;frame count")."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = [frame.split(" (")[0] + " " + _where(frame) for frame in stack.split(";")]
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    lines = [f"{total} samples", "", "inclusive  own     function"]
    for frame, count in inclusive.most_common(top):
        lines.append(f"{count / total:6.1%}  {own[frame] / total:6.1%}  {frame}")
    lines += ["", "own time, heaviest:"]
    lines += [f"{count / total:6.1%}  {frame}" for frame, count in own.most_common(top)]
    return "\n".join(lines)


def _where(frame: str) -> str:
    """`(path/to/module.py:12)` as `module.py`, so that a function's lines add up."""
    inside = frame[frame.find("(") + 1 : frame.rfind(")")] if "(" in frame else ""
    return inside.rsplit("/", 1)[-1].split(":")[0]


if __name__ == "__main__":
    main()
