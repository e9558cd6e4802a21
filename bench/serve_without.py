"""`credgate serve` without one of its per-request features, for the benchmark to show what that feature costs.

    python bench/serve_without.py metrics serve --port 8080
    python bench/serve_without.py request-log serve --port 8080

The same code as `credgate serve`, but for the one call per request that makes the feature's work:
- `metrics`: no request is counted in the Prometheus metrics (with CREDGATE_LOG_LEVEL=warning as well, it is the
  gateway without its access log and its metrics);
- `request-log`: every request's record is dropped instead of waiting for the next batch, so no response's usage
  is read and no row is written.
One process only: a worker started by `--workers` would not have the change.
"""

import sys

from credgate import cli, metrics
from credgate.services.usage import UsageRecorder

if __name__ == "__main__":
    feature = sys.argv.pop(1) if len(sys.argv) > 1 else ""
    if feature == "metrics":
        metrics.RequestCounts.served = lambda *_args: None  # type: ignore[method-assign]
    elif feature == "request-log":
        UsageRecorder.record = lambda _self, _request: None  # type: ignore[method-assign,assignment]
    else:
        sys.exit(f"serve_without.py: no feature named {feature!r} (metrics, request-log)")
    cli.main(prog_name="credgate")
