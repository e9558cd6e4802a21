"""What writing the request log costs, per row: the CPU time of recording a batch of requests (each response's
usage read) and of writing it (UsageRecorder.flush: the rows' parameters, the INSERT statement and the commit, the
SQLite thread included).

    .venv/bin/python bench/request_log.py [--rows 1 64 300 512] [--rounds 7]

On the embedded SQLite file, in a folder of its own. Prints the median over the rounds, per batch size: under
load a batch is what arrives in 0.1 s (at most 512 rows), so at 3,000 requests/s about 300.
"""

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from credgate.config import Settings
from credgate.services import projects
from credgate.services.bootstrap import open_context
from credgate.services.usage import ProxiedRequest, UsageRecorder

# An OpenAI chat completion, as the benchmark's upstream answers it.
BODY = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21}}'
)


def served(project_id: str) -> ProxiedRequest:
    request = ProxiedRequest(
        at=datetime.now(UTC),
        project_id=project_id,
        token_hash="0" * 64,
        request_id="0123456789abcdef",
        method="POST",
        provider="openai",
        endpoint="chat/completions",
        started=time.perf_counter(),
    )
    request.start_response(200, "application/json", "")
    request.capture(BODY)
    request.duration_ms, request.request_bytes, request.admitted = 3.2, 120, True
    return request


async def measure(settings: Settings, sizes: list[int], rounds: int) -> dict[int, float]:
    """The median CPU time of a flush, per row, in µs, by batch size."""
    ctx = await open_context(settings)
    try:
        project, _ = await projects.create_project(ctx, name="bench", actor="bench")
        recorder = UsageRecorder(ctx)
        taken: dict[int, list[float]] = {size: [] for size in sizes}
        for round_ in range(rounds + 1):  # the first round warms up: statements compiled, pages cached
            for size in sizes:
                requests = [served(project.id) for _ in range(size)]
                started = time.process_time()  # every thread of the process: the SQLite thread's work counts
                for request in requests:
                    recorder.record(request)  # where each request's usage is read
                await recorder.flush()
                if round_:
                    taken[size].append((time.process_time() - started) / size * 1e6)
        return {size: statistics.median(times) for size, times in taken.items()}
    finally:
        await ctx.database.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64, 300, 512])
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="credgate-bench-log-") as work:
        settings = Settings(data_dir=Path(work) / "data")
        per_row = asyncio.run(measure(settings, options.rows, options.rounds))
    print("| rows a flush | CPU µs a row | CPU ms a flush |\n|---:|---:|---:|")
    for size, micros in per_row.items():
        print(f"| {size} | {micros:.1f} | {micros * size / 1000:.2f} |")


if __name__ == "__main__":
    main()
