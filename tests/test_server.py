"""The worker processes' start: what a spawned worker runs before the gateway."""

import multiprocessing
import os
import sys
import types
from pathlib import Path

import pytest

from credgate.server import _main_not_rerun_in_workers


def _spawned_exit_code() -> int | None:
    worker = multiprocessing.get_context("spawn").Process(target=os.getpid)  # uvicorn spawns its workers
    worker.start()
    worker.join(30)
    return worker.exitcode


def test_a_spawned_worker_does_not_run_the_credgate_script_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "credgate"
    script.write_text("import sys\nsys.exit('the script ran again in a worker')\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    main.__spec__ = None  # as for a console script
    monkeypatch.setitem(sys.modules, "__main__", main)

    assert _spawned_exit_code() == 1  # what multiprocessing does by itself

    with _main_not_rerun_in_workers():
        assert _spawned_exit_code() == 0
    assert main.__spec__ is None
