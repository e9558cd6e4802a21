"""`credgate serve` with its Prometheus metrics not counted, for the benchmark to show what counting costs.

    python bench/unobserved_serve.py serve --port 8080

Run with CREDGATE_LOG_LEVEL=warning as well, it is the gateway without its access log and its metrics: the same
code as `credgate serve`, but for the one call per request that counts a request in the metrics.
"""

from credgate import cli, metrics

if __name__ == "__main__":
    metrics.request_served = lambda *_args: None
    cli.main(prog_name="credgate")
