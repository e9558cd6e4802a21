"""The endpoint path grammar: one definition of a path segment, used to confine a client's path under the
integration's base path and to match it against the endpoint allow-list, so the two can never disagree.

A segment is decoded once (percent-escapes must be well formed). It may not be empty (but for a trailing
slash), hold a separator (`/`, `\\`, `?`, `#`) or a control character, or be a dot segment. Dot segments are
recognised the way lenient upstream servers read them: with path parameters (`..;x=y`, Tomcat, Jetty) and
surrounding spaces removed, and any run of dots counts (Windows servers read `...` as `..`).
"""

import functools
import re
from collections.abc import Iterable
from typing import Protocol
from urllib.parse import unquote_to_bytes, urlsplit

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_FORBIDDEN_BYTES = frozenset(b"/\\?#\x7f") | frozenset(range(0x20))
_CACHED_PATH_LENGTH = 200  # 1,024 parses of at most this length are kept


class MalformedPath(ValueError):
    """The path could leave the base path, or an upstream could read it differently than credgate does."""


def parse_segment(raw: str) -> str:
    """One raw (still percent-encoded) segment → its decoded text; MalformedPath if it breaks the grammar."""
    if _BAD_ESCAPE.search(raw):
        raise MalformedPath("malformed percent-escape")
    segment = unquote_to_bytes(raw)
    if not segment or any(byte in _FORBIDDEN_BYTES for byte in segment):
        raise MalformedPath("empty segment or a separator or control character in a segment")
    if not segment.split(b";", 1)[0].strip(b" ").strip(b"."):
        raise MalformedPath("dot segment")  # also `...`, which Windows servers read as `..`
    return segment.decode("utf-8", "replace")


def parse_path(raw_path: str) -> tuple[str, ...]:
    """A raw endpoint path → its decoded segments; a trailing slash is kept as a last empty segment, which some
    APIs need (an allow-list's `*` or `**` lets it through)."""
    # Clients call the same few endpoints over and over: their parses are kept, within a bounded size.
    return _parse_common_path(raw_path) if len(raw_path) <= _CACHED_PATH_LENGTH else _parse_path(raw_path)


def _parse_path(raw_path: str) -> tuple[str, ...]:
    if not raw_path:
        raise MalformedPath("empty path")
    raws = raw_path.split("/")
    trailing = len(raws) > 1 and raws[-1] == ""
    segments = tuple(parse_segment(raw) for raw in (raws[:-1] if trailing else raws))
    return (*segments, "") if trailing else segments


_parse_common_path = functools.lru_cache(maxsize=1024)(_parse_path)


def path_matches(pattern: str, segments: tuple[str, ...] | list[str]) -> bool:
    """An allow-list pattern (`*` one segment, `**` one or more remaining) against parsed segments."""
    parts = pattern.split("/")
    for index, part in enumerate(parts):
        if part == "**":
            return len(segments) > index
        if index >= len(segments) or (part != "*" and part != segments[index]):
            return False
    return len(parts) == len(segments)


class AllowedEndpoint(Protocol):
    """An allow-list's entry (specs.Endpoint): a method, `*` for any, and a path pattern."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...


class AllowList:
    """An endpoint allow-list compiled once: a pattern without wildcards is a dict entry, found in one lookup
    however long the list; only the wildcard patterns are matched in turn. Admits exactly what path_matches
    would, pattern by pattern."""

    __slots__ = ("_exact", "_wildcards")

    def __init__(self, endpoints: Iterable[AllowedEndpoint]) -> None:
        self._exact: dict[tuple[str, ...], set[str]] = {}
        self._wildcards: list[tuple[str, str]] = []
        for endpoint in endpoints:
            method, pattern = endpoint.method, endpoint.path
            parts = tuple(pattern.split("/"))
            if "*" in parts or "**" in parts:
                self._wildcards.append((method, pattern))
            else:
                self._exact.setdefault(parts, set()).add(method)

    def admits(self, method: str, segments: tuple[str, ...]) -> bool:
        methods = self._exact.get(segments)
        if methods is not None and (method in methods or "*" in methods):
            return True
        return any(
            (allowed in ("*", method)) and path_matches(pattern, segments) for allowed, pattern in self._wildcards
        )


def rebase_path(pattern: str, *, from_base: str, to_base: str) -> str:
    """An endpoint pattern written under one base URL's path, written under another's, naming the same upstream
    path: `v1/chat/completions` under `https://api.x` is `chat/completions` under `https://api.x/v1`. Left as it
    is when the new base path is not a prefix of the full path (another host, a proxy of the user's own)."""
    full = [segment for segment in f"{urlsplit(from_base).path}/{pattern}".split("/") if segment]
    prefix = [segment for segment in urlsplit(to_base).path.split("/") if segment]
    if len(full) > len(prefix) and full[: len(prefix)] == prefix:
        return "/".join(full[len(prefix) :])
    return pattern
