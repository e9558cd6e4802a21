"""The endpoint path grammar: what confines a client's path and what the allow-list matches, in one place."""

from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from credgate.paths import AllowList, MalformedPath, parse_path, path_matches, rebase_path


@pytest.mark.parametrize(
    "raw",
    [
        "..",
        ".",
        "a/../b",
        "%2e%2e",
        ".%2E",
        "..;",
        "..;x=y",
        "%2e%2e%3bx",
        "..%3b",
        ";x",
        "...",
        " .. ",
        "models/..;/admin",
        "a%2Fb",
        "a%5Cb",
        "a%00b",
        "a%0d%0ab",
        "a%7Fb",
        "a\\b",
        "a//b",
        "/a",
        "a%zz",
        "a%2",
        "",
    ],
)
def test_a_path_that_could_leave_the_base_path_or_be_read_otherwise_is_malformed(raw: str) -> None:
    with pytest.raises(MalformedPath):
        parse_path(raw)


@pytest.mark.parametrize(
    ("raw", "segments"),
    [
        ("chat/completions", ("chat", "completions")),
        ("models/gpt-4o%3Aft", ("models", "gpt-4o:ft")),
        ("models/gemini-pro:generateContent", ("models", "gemini-pro:generateContent")),
        ("files/a%20b", ("files", "a b")),
        ("models/", ("models", "")),
        ("a;b", ("a;b",)),
        ("..a", ("..a",)),
        ("%ff", ("\ufffd",)),
    ],
)
def test_a_well_formed_path_is_decoded_once(raw: str, segments: tuple[str, ...]) -> None:
    assert parse_path(raw) == segments


@pytest.mark.parametrize(
    ("pattern", "raw", "allowed"),
    [
        ("models/*", "models/gpt-4o", True),
        ("models/*", "models/gpt-4o/extra", False),
        ("models/**", "models/a/b", True),
        ("models/**", "models", False),
        ("models/*", "models/", True),
        ("chat/completions", "chat/completions", True),
        ("chat/completions", "chat/completions;x=1", False),  # a lenient upstream reads it as allowed: refused
    ],
)
def test_the_allow_list_matches_parsed_segments(pattern: str, raw: str, allowed: bool) -> None:
    assert path_matches(pattern, parse_path(raw)) is allowed


@pytest.mark.parametrize(
    ("pattern", "from_base", "to_base", "rebased"),
    [
        ("v1/chat/completions", "https://api.mistral.ai", "https://api.mistral.ai/v1", "chat/completions"),
        ("chat/completions", "https://api.mistral.ai/v1", "https://api.mistral.ai", "v1/chat/completions"),
        ("v1/models/*", "https://api.x", "https://api.x/v1/", "models/*"),
        ("openai/deployments/*/chat/completions", "https://r.openai.azure.com", "https://r.openai.azure.com/openai",
         "deployments/*/chat/completions"),
        ("v1/chat/completions", "https://api.mistral.ai", "https://proxy.corp/mistral", "v1/chat/completions"),
        ("v1", "https://api.x", "https://api.x/v1", "v1"),  # nothing would be left: kept as it is
    ],
)  # fmt: skip
def test_an_endpoint_is_rebased_onto_the_integrations_own_base_path(
    pattern: str, from_base: str, to_base: str, rebased: str
) -> None:
    assert rebase_path(pattern, from_base=from_base, to_base=to_base) == rebased


class Rule(NamedTuple):
    method: str
    path: str


_SEGMENTS = st.sampled_from(["a", "b", "items", "", "*", "**"])
_METHODS = st.sampled_from(["GET", "POST", "*"])


@given(
    rules=st.lists(st.tuples(_METHODS, st.lists(_SEGMENTS, min_size=1, max_size=3).map("/".join)), max_size=6),
    method=st.sampled_from(["GET", "POST"]),
    segments=st.lists(st.sampled_from(["a", "b", "items", ""]), min_size=1, max_size=4).map(tuple),
)
@settings(max_examples=400, deadline=None)
def test_an_allow_list_admits_exactly_what_its_patterns_match_one_by_one(
    rules: list[tuple[str, str]], method: str, segments: tuple[str, ...]
) -> None:
    one_by_one = any(rule in ("*", method) and path_matches(pattern, segments) for rule, pattern in rules)
    assert AllowList(Rule(*rule) for rule in rules).admits(method, segments) is one_by_one
