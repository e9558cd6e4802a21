"""The reliability catalogue as a standing suite: one module per group (bad input, auth and isolation, secrets,
SSRF, faults, load), each test named after its catalogue id (`test_bi01_…`). The real-socket fixtures are the
end-to-end suite's own."""

import pytest

from tests.e2e.conftest import (  # noqa: F401  (fixtures, re-exported for this folder)
    backend,
    gateway,
    gateway_url,
    project,
    upstream,
)


@pytest.fixture
def stale_seconds() -> float:
    """CREDGATE_STALE_SECONDS of the gateway behind a database relay (`relayed`); a test may parametrize it."""
    return 30.0
