"""The secret sweep: every provider key a test sends is searched for in every response and log record of the
whole run, and in each SQLite database file; the run fails if one is found (no secret in any response, log or file).

A secret is found as written and encoded: base64 (standard or URL-safe, at any alignment, as inside a Basic
header), hex, percent-encoded and JSON-escaped. Encoded text is decoded once, rather than each secret encoded
many times: the whole run's text is searched a few times over, however many secrets there are.
"""

import binascii
import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

# Runs long enough to encode the shortest registered secret (8 bytes: 11 base64 or 16 hex characters).
_BASE64_RUN = re.compile(rb"[A-Za-z0-9+/]{11,}")  # after URL-safe characters are mapped
_HEX_RUN = re.compile(rb"[0-9A-Fa-f]{16,}")
_URL_SAFE = bytes.maketrans(b"-_", b"+/")


def decoded_views(data: bytes) -> list[bytes]:
    """`data` as written, and what its base64, hex and percent-encoded parts decode to."""
    runs = _BASE64_RUN.findall(data.translate(_URL_SAFE))
    # The encoded secret may start at any of four places in a base64 run, and two in a hex run. Pieces cut to
    # whole groups decode as one string (a few bytes across their joins are noise, never a missed secret).
    decoded = [
        binascii.a2b_base64(b"".join(run[start : len(run) - (len(run) - start) % 4] for run in runs))
        for start in range(4)
    ]
    hex_runs = _HEX_RUN.findall(b" ".join(runs))  # hex digits are base64 characters: search the runs only
    decoded += [
        binascii.unhexlify(b"".join(run[start : len(run) - (len(run) - start) % 2] for run in hex_runs))
        for start in range(2)
    ]
    views = [data, b"\x00".join(decoded)]
    if b"%" in data:
        views.append(unquote_to_bytes(data))
    return views


def written_forms(secret: str) -> set[bytes]:
    """The spellings of `secret` the decoded views cannot restore: JSON escapes."""
    return {secret.encode(), json.dumps(secret)[1:-1].encode(), json.dumps(secret, ensure_ascii=False)[1:-1].encode()}


def exposed(data: bytes | str, secrets: Iterable[str]) -> set[str]:
    """The secrets that appear in `data`, as written or encoded."""
    if isinstance(data, str):
        data = data.encode("utf-8", "backslashreplace")
    views = decoded_views(data)
    return {secret for secret in secrets if any(form in view for form in written_forms(secret) for view in views)}


@dataclass
class SecretSweep:
    secrets: set[str] = field(default_factory=set)
    texts: list[tuple[str, str]] = field(default_factory=list)  # (where, text)
    leaks: list[str] = field(default_factory=list)

    def register(self, secret: str) -> None:
        if len(secret) >= 8:  # shorter test values would match by chance
            self.secrets.add(secret)

    def register_request_body(self, body: bytes) -> None:
        """Register every `api_key` a request carried (anywhere in its JSON)."""
        try:
            document = json.loads(body)
        except ValueError:
            return
        for value in _values_named(document, "api_key"):
            if isinstance(value, str):
                self.register(value.strip())

    def capture(self, where: str, text: str) -> None:
        self.texts.append((where, text))

    def scan_file(self, path: Path, secrets: Iterable[str]) -> None:
        if path.exists():
            self.leaks.extend(f"{path.name}: {secret[:6]}…" for secret in sorted(exposed(path.read_bytes(), secrets)))

    def findings(self) -> list[str]:
        found = list(self.leaks)
        # One search of all the text first; only a secret found there is looked for text by text, to say where.
        for secret in sorted(exposed("\x00".join(text for _, text in self.texts), self.secrets)):
            found.extend(f"{where}: {secret[:6]}…" for where, text in self.texts if exposed(text, [secret]))
        return found


def _values_named(document: Any, name: str) -> Iterable[Any]:
    if isinstance(document, dict):
        for key, value in document.items():
            if key == name:
                yield value
            yield from _values_named(value, name)
    elif isinstance(document, list):
        for item in document:
            yield from _values_named(item, name)


class SweepHandler(logging.Handler):
    """Keeps every log record of the run, formatted with its traceback, for the sweep."""

    def __init__(self, sweep: SecretSweep) -> None:
        super().__init__(level=logging.DEBUG)
        self.sweep = sweep
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.sweep.capture(f"log {record.name}", self.format(record))


SWEEP = SecretSweep()
