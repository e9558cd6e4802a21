"""The audit log's hash chain (credgate.audit_chain): the canonical form, pinned, and what a verification catches."""

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from credgate.audit_chain import (
    GENESIS,
    ChainBroken,
    canonical,
    chain_entry,
    entry_hash,
    format_time,
    normalized,
    verify_lines,
)

AT = datetime(2025, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)


def chain(count: int) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for number in range(count):
        entry = chain_entry(
            at=AT + timedelta(seconds=number),
            actor="admin-token:ops",
            action="project.update",
            project_id=f"prj_{number}",
            provider="openai" if number % 2 else None,
            detail={"private_networks": ["10.0.0.0/8"]} if number == 1 else None,
            previous_hash=entries[-1]["hash"] if entries else GENESIS,
        )
        entries.append({"id": number + 1, **entry})
    return entries


def lines(entries: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(entry) + "\n" for entry in entries]


def test_the_canonical_form_and_its_hash_are_pinned() -> None:
    """Changing the form would break every chain already written: this value must never change."""
    entry = chain_entry(
        at=AT,
        actor="cli:ana",
        action="integration.private_networks",
        project_id="prj_1",
        provider="ollama",
        detail={"private_networks": ["10.0.0.0/8"], "b": "é"},
        previous_hash=GENESIS,
    )
    expected = (
        '{"action":"integration.private_networks","actor":"cli:ana","at":"2025-01-02T03:04:05.006000Z",'
        '"detail":{"b":"é","private_networks":["10.0.0.0/8"]},"previous_hash":"' + GENESIS + '",'
        '"project_id":"prj_1","provider":"ollama"}'
    )
    assert entry["hash"] == hashlib.sha256(expected.encode()).hexdigest()


def test_times_are_rfc3339_utc_with_microseconds_and_naive_ones_are_refused() -> None:
    assert format_time(datetime(2025, 1, 1, 2, tzinfo=timezone(timedelta(hours=2)))) == "2025-01-01T00:00:00.000000Z"
    with pytest.raises(ValueError, match="naive"):
        format_time(datetime(2025, 1, 1))


def test_the_id_and_unknown_keys_are_not_hashed() -> None:
    entry = chain(1)[0]
    assert entry_hash({**entry, "id": 99, "note": "x"}) == entry["hash"]


def test_detail_is_stored_as_it_reads_back_and_nan_has_no_canonical_form() -> None:
    assert normalized({"networks": ("a", "b"), "n": 1}) == {"n": 1, "networks": ["a", "b"]}
    with pytest.raises(ValueError, match="JSON compliant"):
        canonical({"n": float("nan")})


def test_an_intact_export_verifies_to_its_head() -> None:
    entries = chain(5)
    verified = verify_lines(lines(entries))
    assert (verified.entries, verified.head) == (5, entries[-1]["hash"])
    assert (verify_lines([]).entries, verify_lines([]).head) == (0, GENESIS)


def broken_at(text: Sequence[str | bytes]) -> ChainBroken:
    with pytest.raises(ChainBroken) as caught:
        verify_lines(text)
    return caught.value


@pytest.mark.parametrize("field", ["at", "actor", "action", "project_id", "provider", "detail"])
def test_an_edited_field_breaks_that_line(field: str) -> None:
    entries = chain(5)
    entries[2][field] = {"x": 1} if field == "detail" else "2025-01-01T00:00:00.000000Z"
    broken = broken_at(lines(entries))
    assert (broken.position, broken.problem) == (3, "hash mismatch: the entry was edited")


def test_an_edited_entry_with_its_hash_recomputed_breaks_the_next_line() -> None:
    entries = chain(5)
    entries[2]["actor"] = "someone else"
    entries[2]["hash"] = entry_hash(entries[2])
    broken = broken_at(lines(entries))
    assert broken.position == 4
    assert broken.problem.startswith("previous_hash mismatch")


def test_a_deleted_entry_breaks_the_line_after_it() -> None:
    entries = chain(5)
    del entries[2]
    assert broken_at(lines(entries)).position == 3
    assert broken_at(lines(chain(5)[1:])).position == 1  # the first entry deleted: the genesis link fails


def test_reordered_entries_break() -> None:
    entries = chain(5)
    entries[1], entries[2] = entries[2], entries[1]
    broken = broken_at(lines(entries))
    assert broken.position == 2
    assert broken.problem.startswith("previous_hash mismatch")


def test_entries_removed_from_the_end_still_verify_to_an_older_head() -> None:
    """The chain alone cannot tell: the head must be compared with one known otherwise (README)."""
    entries = chain(5)
    assert verify_lines(lines(entries[:3])).head == entries[2]["hash"] != entries[-1]["hash"]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("not json\n", "malformed line: not JSON"),
        (b"\xff\xfe{}\n", "malformed line: not JSON"),
        ("[1, 2]\n", "malformed entry: not a JSON object"),
        ('{"at": "x"}\n', "malformed entry: missing actor, action"),
        ("\n", "malformed line: not JSON"),
    ],
)
def test_a_malformed_line_is_named(line: str | bytes, problem: str) -> None:
    entries = lines(chain(3))
    broken = broken_at([entries[0], line, *entries[1:]])
    assert broken.position == 2
    assert broken.problem.startswith(problem)


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("actor", None, "actor is not a string"),
        ("provider", 3, "provider is neither a string nor null"),
        ("detail", [1], "detail is neither an object nor null"),
        ("hash", "abc", "hash is not 64 hex digits"),
        ("previous_hash", "A" * 64, "previous_hash is not 64 hex digits"),
        ("detail", {"n": float("nan")}, "it has no canonical JSON form"),
    ],
)
def test_a_field_of_the_wrong_kind_is_malformed(field: str, value: object, problem: str) -> None:
    entries = chain(2)
    entries[0][field] = value
    assert broken_at(lines(entries)).problem == f"malformed entry: {problem}"
