"""The limits, defined once: what they accept, how they say it, and how typed text is read into them."""

import pytest

from credgate.errors import InvalidInput
from credgate.limits import (
    GraceSeconds,
    Name,
    Password,
    TimeoutSeconds,
    describe,
    parse_float,
    parse_int,
    within,
)


def test_each_limit_describes_its_whole_range() -> None:
    assert describe(TimeoutSeconds) == "a number above 0, at most 3600"
    assert describe(GraceSeconds) == "a whole number from 0 to 2592000"
    assert describe(Name) == "1 to 200 characters"
    assert describe(Password) == "at least 12 characters"


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400", "0", "3600.5", "abc", "", "0x10"])
def test_typed_text_out_of_a_range_of_numbers_is_refused_in_words(text: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_float("timeout_seconds", TimeoutSeconds, text)
    assert str(raised.value) == "timeout_seconds: must be a number above 0, at most 3600"


@pytest.mark.parametrize("text", [str(2**64), str(2**70), "9" * 5000, "-1", "2.5", "1e3", "true"])
def test_typed_text_out_of_a_range_of_whole_numbers_is_refused(text: str) -> None:
    with pytest.raises(InvalidInput, match=r"^grace_seconds: must be a whole number from 0 to 2592000$"):
        parse_int("grace_seconds", GraceSeconds, text)


def test_typed_text_within_a_range_is_read() -> None:
    assert parse_float("timeout_seconds", TimeoutSeconds, " 2.5 ") == 2.5
    assert parse_int("grace_seconds", GraceSeconds, "60") == 60


def test_a_service_takes_numbers_as_numbers_only() -> None:
    assert within("timeout_seconds", TimeoutSeconds, 30) == 30
    for value in ["30", True, float("nan")]:
        with pytest.raises(InvalidInput):
            within("timeout_seconds", TimeoutSeconds, value)


def test_a_text_limit_names_what_it_refuses_without_quoting_it() -> None:
    with pytest.raises(InvalidInput) as raised:
        within("name", Name, "secret\x00value")
    assert raised.value.problem == "may not hold control characters, line breaks or unpaired surrogates"
    assert "secret" not in str(raised.value)
