"""The `credgate` command: thin commands over the services; `serve` runs the gateway.

Output is the admin API's JSON, so scripts see one shape everywhere. Secrets are read from standard input,
never from arguments (which other users can see in the process list). Exit codes: 0 ok, 1 unexpected,
2 usage or invalid input, 3 not found, 4 conflict, 5 configuration or storage problem.

One module per group of commands; each adds its commands to `main` as it loads, which is when a command of it is
asked for (`CommandsByModule`).
"""

from credgate.cli.base import main

__all__ = ["main"]
