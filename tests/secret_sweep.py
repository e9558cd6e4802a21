"""The secret sweep: every provider key a test sends is searched for in every response and log record of the
whole run, and in each SQLite database file; the run fails if one is found (non-negotiable 4)."""

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
            data = path.read_bytes()
            self.leaks.extend(f"{path.name}: {secret[:6]}…" for secret in secrets if secret.encode() in data)

    def findings(self) -> list[str]:
        found = list(self.leaks)
        for where, text in self.texts:
            found.extend(f"{where}: {secret[:6]}…" for secret in self.secrets if secret in text)
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
