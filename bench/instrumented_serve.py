"""`credgate serve` with a probe for the soak: on SIGUSR1 the gateway prints its asyncio task count.

    python bench/instrumented_serve.py serve --port 8080

The app is the one `credgate serve` builds, by the same code: only `create_app` is wrapped, to install the
signal handler on the serving loop. The probe opens no socket and starts no task, so it changes nothing it
counts; its line goes to standard output, where the soak reads it (the gateway logs to standard error).
"""

import asyncio
import json
import signal
from typing import Any
from unittest import mock

from credgate import app, cli
from credgate.app import Gateway, create_app
from harness import PROBE_PREFIX


def create_probed_app(*args: Any, **kwargs: Any) -> Gateway:
    gateway = create_app(*args, **kwargs)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, report, gateway)
    return gateway


def report(gateway: Gateway) -> None:
    counts = {"tasks": len(asyncio.all_tasks()), "proxy_in_flight": getattr(gateway.proxy, "in_flight", None)}
    print(PROBE_PREFIX + json.dumps(counts), flush=True)


if __name__ == "__main__":
    # `serve` imports create_app when it runs: patched where it is defined.
    with mock.patch.object(app, "create_app", create_probed_app):
        cli.main(prog_name="credgate")
