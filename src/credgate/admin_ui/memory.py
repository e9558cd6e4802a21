"""What the panel keeps between two requests of one session, in memory and briefly: a message to show once,
a token to show once, and an Add-new-API set-up waiting for its review. Never written anywhere."""

import time
from dataclasses import dataclass, field

from credgate.crypto import Secret

_TTL_SECONDS = 600


@dataclass
class PendingSetup:
    """An Add-new-API set-up between "enter key and template" and "review and save"."""

    project_id: str
    provider: str
    template_id: str
    api_key: Secret | None
    base_url: str | None


@dataclass
class _Entry:
    created: float = field(default_factory=time.monotonic)
    messages: list[str] = field(default_factory=list)
    secret: str | None = None
    pending: PendingSetup | None = None


class PanelMemory:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def _entry(self, session_id: str) -> _Entry:
        now = time.monotonic()
        for key in [key for key, entry in self._entries.items() if now - entry.created > _TTL_SECONDS]:
            del self._entries[key]
        return self._entries.setdefault(session_id, _Entry())

    def flash(self, session_id: str, message: str, *, secret: str | None = None) -> None:
        entry = self._entry(session_id)
        entry.messages.append(message)
        if secret is not None:
            entry.secret = secret

    def take_flash(self, session_id: str) -> tuple[list[str], str | None]:
        """The messages and the one-time secret, which are then gone."""
        entry = self._entries.get(session_id)
        if entry is None:
            return [], None
        messages, secret = entry.messages, entry.secret
        entry.messages, entry.secret = [], None
        return messages, secret

    def hold(self, session_id: str, pending: PendingSetup) -> None:
        entry = self._entry(session_id)
        entry.pending = pending
        entry.created = time.monotonic()

    def pending(self, session_id: str) -> PendingSetup | None:
        entry = self._entries.get(session_id)
        return entry.pending if entry is not None else None

    def release(self, session_id: str) -> None:
        entry = self._entries.get(session_id)
        if entry is not None:
            entry.pending = None

    def forget(self, session_id: str) -> None:
        self._entries.pop(session_id, None)
