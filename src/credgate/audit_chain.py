"""The audit log's hash chain: the canonical form of an entry, its hash, and the check of a sequence of entries.

Pure (no I/O, nothing of storage): writing (storage's `Repository.append_audit_event`), the export, the migration
that chained the entries already there, and both verifications use these functions and nothing else.

An entry's `hash` is the SHA-256, in hex, of the canonical JSON (keys sorted, no spaces, UTF-8) of its fields
`HASHED_FIELDS`: `at` as RFC 3339 UTC text with microseconds, `actor`, `action`, `project_id`, `provider`,
`detail` and `previous_hash`, the `hash` of the entry before it (`GENESIS` for the first). The row's `id` is not
hashed: it is where the entry is stored, while the order is the chain's own (a deleted entry breaks the link of
the one after it, whatever the ids).
"""

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

GENESIS = "0" * 64
HASHED_FIELDS = ("at", "actor", "action", "project_id", "provider", "detail", "previous_hash")
_HASH = re.compile(r"[0-9a-f]{64}")
_OPTIONAL_TEXT = ("project_id", "provider")


def format_time(at: datetime) -> str:
    """`at` as the chain holds it: RFC 3339 in UTC, always with microseconds (`2025-01-01T00:00:00.000000Z`)."""
    if at.tzinfo is None:
        raise ValueError("naive datetimes are not chained")
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical(value: Any) -> bytes:
    """The canonical JSON of `value`: keys sorted, no spaces, UTF-8; NaN and the infinities are refused."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def normalized(detail: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`detail` as it reads back from the database (tuples become lists, keys strings), so what is stored is
    exactly what was hashed."""
    return None if detail is None else dict(json.loads(canonical(detail)))


def entry_hash(entry: Mapping[str, Any]) -> str:
    """The hash of an entry: its `HASHED_FIELDS` (`at` as `format_time` text), any other key ignored."""
    return hashlib.sha256(canonical({name: entry[name] for name in HASHED_FIELDS})).hexdigest()


def chain_entry(
    *,
    at: datetime,
    actor: str,
    action: str,
    project_id: str | None,
    provider: str | None,
    detail: Mapping[str, Any] | None,
    previous_hash: str,
) -> dict[str, Any]:
    """An entry's chained fields (`at` as text) with its `hash`: what is stored, and a line of the export."""
    entry: dict[str, Any] = {
        "at": format_time(at),
        "actor": actor,
        "action": action,
        "project_id": project_id,
        "provider": provider,
        "detail": normalized(detail),
        "previous_hash": previous_hash,
    }
    entry["hash"] = entry_hash(entry)
    return entry


class ChainBroken(Exception):
    """The chain does not hold at the `position`-th entry (1-based), for the reason given."""

    def __init__(self, position: int, problem: str) -> None:
        super().__init__(f"entry {position}: {problem}")
        self.position = position
        self.problem = problem


class ChainCheck:
    """Checks entries one at a time, in order, from `GENESIS`; `head` is the hash of the last entry that held."""

    def __init__(self) -> None:
        self.entries = 0
        self.head = GENESIS

    def check(self, entry: object) -> None:
        """Take the next entry, or raise ChainBroken: malformed, edited (hash mismatch), or not linked to the
        entry before it (previous_hash mismatch: one was deleted or the order changed)."""
        position = self.entries + 1
        if not isinstance(entry, Mapping):
            raise ChainBroken(position, "malformed entry: not a JSON object")
        problem = _malformation(entry)
        if problem is not None:
            raise ChainBroken(position, f"malformed entry: {problem}")
        try:
            found = entry_hash(entry)
        except ValueError:  # NaN, an infinity or an unpaired surrogate: no canonical form
            raise ChainBroken(position, "malformed entry: it has no canonical JSON form") from None
        if found != entry["hash"]:
            raise ChainBroken(position, "hash mismatch: the entry was edited")
        if entry["previous_hash"] != self.head:
            raise ChainBroken(
                position, "previous_hash mismatch: an entry before it was deleted, or the entries were reordered"
            )
        self.entries = position
        self.head = found


def verify_lines(lines: Iterable[str | bytes]) -> ChainCheck:
    """Check an export (JSON Lines in UTF-8, one entry per line, oldest first) from `GENESIS`; ChainBroken names
    the line (1-based). Entries removed from the end go unnoticed: compare the head with one known otherwise."""
    chain = ChainCheck()
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line)
        except ValueError:  # UnicodeDecodeError included
            raise ChainBroken(number, "malformed line: not JSON") from None
        chain.check(entry)
    return chain


def _malformation(entry: Mapping[str, Any]) -> str | None:
    missing = [name for name in (*HASHED_FIELDS, "hash") if name not in entry]
    if missing:
        return f"missing {', '.join(missing)}"
    for name in ("at", "actor", "action"):
        if not isinstance(entry[name], str):
            return f"{name} is not a string"
    for name in _OPTIONAL_TEXT:
        if entry[name] is not None and not isinstance(entry[name], str):
            return f"{name} is neither a string nor null"
    if entry["detail"] is not None and not isinstance(entry["detail"], dict):
        return "detail is neither an object nor null"
    for name in ("previous_hash", "hash"):
        if not isinstance(entry[name], str) or not _HASH.fullmatch(entry[name]):
            return f"{name} is not 64 hex digits"
    return None
