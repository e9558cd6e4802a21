"""Panel tests in process. They are about pages, forms and session defences, not password hashing: argon2 at a
quick cost here (as in tests/reliability); tests/services/test_password_hashing.py holds the production cost, and
the browser tests sign in against `credgate serve` at that cost."""

from tests.reliability.test_auth_isolation import (  # noqa: F401  (an autouse fixture, re-exported for this folder)
    _quick_password_hashing,
)
