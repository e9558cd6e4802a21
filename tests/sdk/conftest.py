"""Provider SDK tests: each official SDK, changed only in its base URL and key, through the gateway to a stand-in
that answers in the provider's documented shape only at the provider's real paths (404 anywhere else), so a
wrong path fails the test. The stand-in and its helpers are in `tests/sdk/standin.py`."""

from tests.e2e.conftest import (  # noqa: F401  (fixtures, re-exported for this folder)
    backend,
    gateway_url,
    project,
    upstream,
)
