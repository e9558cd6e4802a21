"""The reliability catalogue as a standing suite: one module per group (bad input, auth and isolation, secrets,
SSRF, faults, load), each test named after its catalogue id (`test_bi01_…`). The real-socket fixtures are the
end-to-end suite's own."""

from tests.e2e.conftest import (  # noqa: F401  (fixtures, re-exported for this folder)
    backend,
    gateway,
    gateway_url,
    project,
    upstream,
)
