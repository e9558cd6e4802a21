"""tests/teardown_guard.py: a CancelledError in one test's fixture teardown is that test's error alone."""

import pytest

pytest_plugins = ["pytester"]

INNER = """
import asyncio

import pytest


@pytest.fixture
def cancelled_on_teardown():
    yield
    raise asyncio.CancelledError


def test_first(tmp_path, cancelled_on_teardown):
    (tmp_path / "first-was-here").touch()


def test_second(tmp_path):
    assert not (tmp_path / "first-was-here").exists()
"""


def test_a_teardown_cancelled_errs_on_its_own_test_and_the_next_gets_fresh_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(INNER)
    result = pytester.runpytest_inprocess("-p", "tests.teardown_guard", "-p", "no:asyncio", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_first*", "*fixture 'cancelled_on_teardown' raised*"])
