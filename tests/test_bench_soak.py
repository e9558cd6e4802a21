"""bench/soak.py --quick: the soak and leak check still runs end to end and judges every criterion it reports."""

import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).parents[1] / "bench" / "soak.py"
CRITERIA = {
    "FT-07": [
        "upstream connection closed within 1 s of each client leaving mid-stream",
        "asyncio tasks = baseline ± 5",
        "open fds = baseline ± 5",
        "active upstream connections = 0",
        "RSS within +5 MiB of baseline",
        "the next 100 normal requests succeed",
    ],
    "LS-06": [
        "streamed upstream 429s in a row relayed unchanged",
        "requests succeed (no pool exhaustion)",
        "active upstream connections never above the 20 clients",
        "asyncio tasks = baseline ± 5",
    ],
    "LS-05": [
        "every answer as expected",
        "asyncio tasks = baseline ± 5",
        "open fds = baseline ± 5",
        "RSS within +50 MiB of baseline",
        "idle within 10 % of baseline",
        "no error in the gateway's log",
    ],
}


def test_quick_soak_passes_each_criterion() -> None:
    result = subprocess.run(
        [sys.executable, str(SOAK), "--quick"], capture_output=True, text=True, timeout=180, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    verdicts = [line for line in result.stdout.splitlines() if line.startswith(("- PASS ", "- FAIL "))]
    for item, texts in CRITERIA.items():
        for text in texts:
            assert any(line.startswith(f"- PASS {item}: ") and text in line for line in verdicts), (item, text, output)
    assert not [line for line in verdicts if line.startswith("- FAIL")]
    assert "**PASS**, total runtime" in result.stdout
