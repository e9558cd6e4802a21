"""What compiling credgate's hot modules would give: the same gateway in pure Python and compiled by mypyc, side by
side.

    .venv/bin/python bench/compiled.py [--rounds 4] [--duration 5] [--keep DIR] [MODULE ...]

mypyc (mypy's compiler, in the dev tools) turns type-annotated modules into C extensions. This copies the working
tree's `src` to a temporary directory (or DIR), compiles the MODULEs there (paths under `src`; by default the six
below), and serves the benchmark's POST chat/completions from two one-worker gateways pinned to the gateway's core,
one importing the tree and one the compiled copy (first on PYTHONPATH), each alone while wrk drives it from the
other core, in turn for `--rounds` rounds. Prints the CPU time a request and the requests/s of each, round by round
and at the median. With `--keep`, the compiled copy stays in DIR, to run the tests against it:
`PYTHONPATH=DIR/src .venv/bin/python -m pytest -n 2 tests/proxy`. Needs wrk and a C compiler (about a minute).

Left out of the default set, as mypyc compiles them today: `server.py` (uvicorn makes a class at run time that
derives from the bounded protocol, and an interpreted class cannot derive from a compiled one), `proxy/client.py`
(an async generator, which mypyc does not compile) and `app.py` (compiled, a call on `BuiltOnFirstUse.app`'s result
raised TypeError: 'FastAPI' object is not iterable). Of the others on a request's path, `proxy/deadlines.py`,
`proxy/cors.py`, `proxy/key_pools.py`, `limits.py` and `paths.py` compile and serve (the eleven: 9.8% less CPU a
request, against 8.4% for the six); `crypto.py` compiled, but its `Secret` then failed (SystemError: returned a
result with an exception set), `proxy/guard.py` and `proxy/upstreams.py` do not compile (a class derived from a
builtin type; a class with __slots__), and `error_responses.py`'s C did not build.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import BIN, GATEWAY_CORE, add_bench_project, free_port, gateway_env, pinned, start_upstream, wait_for_port
from run import CHAT, LUA, System, alone, loaded, start, wrk

SOURCE = Path(__file__).resolve().parent.parent / "src"
HOT_MODULES = [
    "credgate/proxy/plan.py",
    "credgate/proxy/relay.py",
    "credgate/services/access.py",
    "credgate/services/usage.py",
    "credgate/log_format.py",
    "credgate/metrics.py",
]


def compile_copy(into: Path, modules: list[str]) -> Path:
    """A copy of `src` in `into`, its `modules` compiled in place; returns the copy's `src`."""
    copy = into / "src"
    shutil.copytree(SOURCE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    result = subprocess.run([str(BIN / "mypyc"), *modules], cwd=copy, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"mypyc failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--keep", type=Path, help="compile into this directory and leave it there")
    parser.add_argument("modules", nargs="*", default=HOT_MODULES, help="modules to compile, as paths under src")
    options = parser.parse_args()
    for tool in ("wrk", "cc"):
        if not shutil.which(tool):
            sys.exit(f"this benchmark needs {tool}")

    work = Path(tempfile.mkdtemp(prefix="credgate-compiled-"))
    compiled_into = options.keep or work / "compiled"
    if (compiled_into / "src").exists():
        sys.exit(f"{compiled_into / 'src'} exists already: --keep wants a directory without one")
    compiled_into.mkdir(parents=True, exist_ok=True)
    print(f"compiling {', '.join(options.modules)} …", flush=True)
    compiled_src = compile_copy(compiled_into, options.modules)
    upstream_port = free_port()
    env = gateway_env(work / "data")
    token = add_bench_project(env, upstream_port, ["POST chat/completions"])
    script = work / "post.lua"
    script.write_text(LUA % token)
    systems: list[System] = []
    upstream = start_upstream(upstream_port)
    try:
        wait_for_port(upstream_port)
        for name, python_path in (("pure Python", None), ("compiled", compiled_src)):
            port = free_port()
            system_env = dict(env)
            if python_path is not None:
                system_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(python_path), env.get("PYTHONPATH")]))
            command = pinned(GATEWAY_CORE, [str(BIN / "credgate"), "serve", "--port", str(port)])
            system = System(name, command, port, CHAT, "", system_env)
            systems.append(system)
            process = start(system, work)  # on a database of its own: the other is stopped while this one runs
            if python_path is not None and str(python_path) not in Path(f"/proc/{process.pid}/maps").read_text():
                sys.exit("the compiled copy's gateway did not load its compiled modules")
        for system in systems:
            with alone(system, systems):
                wrk(system.url, script, 64, 2)  # warm up
        samples: dict[str, list[tuple[float, float]]] = {system.name: [] for system in systems}
        for round_number in range(1, options.rounds + 1):
            for system in systems:
                run = loaded(system, systems, script, 64, options.duration)
                samples[system.name].append((run["cpu_us"], run["rps"]))
            print(
                f"round {round_number}: "
                + "; ".join(
                    f"{name} {runs[-1][0]:.0f} µs a request, {runs[-1][1]:,.0f}/s" for name, runs in samples.items()
                ),
                flush=True,
            )
        medians = {
            name: (statistics.median(cpu for cpu, _ in runs), statistics.median(rps for _, rps in runs))
            for name, runs in samples.items()
        }
        (pure_cpu, pure_rps), (compiled_cpu, compiled_rps) = medians["pure Python"], medians["compiled"]
        print(
            f"median of {options.rounds}: pure Python {pure_cpu:.0f} µs a request, {pure_rps:,.0f}/s; compiled "
            f"{compiled_cpu:.0f} µs, {compiled_rps:,.0f}/s ({compiled_cpu / pure_cpu - 1:+.1%} CPU a request, "
            f"{compiled_rps / pure_rps - 1:+.1%} requests/s)"
        )
        if options.keep:
            print(f"the compiled copy: {compiled_src}")
    finally:
        for process in [upstream, *(system.process for system in systems if system.process is not None)]:
            process.terminate()
            process.wait(timeout=40)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
