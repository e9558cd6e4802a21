"""CORS for pages that call the proxy: preflights answered before any token, and the headers a browser needs
to let a page of an allowed origin read a response. A request without `Origin` (every server-side client) pays
one header scan and nothing else.
"""

from starlette.types import Message, Send

from credgate.specs import METHODS

Headers = list[tuple[bytes, bytes]]

_PREFLIGHT_MAX_AGE = b"600"  # seconds a browser may reuse a preflight's answer
_ALLOW_METHODS = ", ".join(METHODS).encode()
_MAX_REQUESTED_HEADERS = 2048
# What a page reads without being told (the CORS-safelisted response headers), and what credgate adds itself.
_SAFELISTED = frozenset(
    {b"cache-control", b"content-language", b"content-length", b"content-type", b"expires", b"last-modified"}
)
_OURS = (b"x-credgate-request-id", b"x-request-id")
_HEADER_NAME_CHARS = frozenset(b"!#$%&'*+.^_`|~0123456789abcdefghijklmnopqrstuvwxyz-, ")


def origin_of(headers: Headers) -> str | None:
    for name, value in headers:
        if name == b"origin":
            return value.decode("latin-1")
    return None


def preflight_of(headers: Headers) -> tuple[str, bytes] | None:
    """(origin, the headers the page asks to send) when this OPTIONS is a CORS preflight; None otherwise (an
    OPTIONS without `Access-Control-Request-Method` is a request like any other, forwarded)."""
    origin = requested = None
    asks = False
    for name, value in headers:
        if name == b"origin":
            origin = value.decode("latin-1")
        elif name == b"access-control-request-method":
            asks = True
        elif name == b"access-control-request-headers":
            requested = value.lower()
    if origin is None or not asks:
        return None
    return origin, requested or b""


def preflight_headers(origin: str, requested: bytes) -> Headers:
    """A preflight's answer for an allowed origin: the methods the proxy forwards and the headers asked for (a
    page's SDK sends its own; credentials are never cookies, so echoing them opens nothing)."""
    headers = [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-allow-methods", _ALLOW_METHODS),
        (b"access-control-max-age", _PREFLIGHT_MAX_AGE),
        (b"vary", b"Origin, Access-Control-Request-Method, Access-Control-Request-Headers"),
        (b"content-length", b"0"),
    ]
    if requested and len(requested) <= _MAX_REQUESTED_HEADERS and set(requested) <= _HEADER_NAME_CHARS:
        headers.append((b"access-control-allow-headers", requested))
    return headers


class CorsSend:
    """Wraps `send` for a request that came with `Origin`: once `allowed`, the response start carries the
    origin, `Vary: Origin` and every header the page may read; the upstream's own CORS headers never pass
    (they speak for the provider's site, not for this gateway)."""

    __slots__ = ("allowed", "origin", "send")

    def __init__(self, send: Send, origin: str) -> None:
        self.send = send
        self.origin = origin
        self.allowed = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [
                (name, value)
                for name, value in message.get("headers", ())
                if not name.lower().startswith(b"access-control-")
            ]
            if self.allowed:
                exposed = {name.lower() for name, _ in headers} - _SAFELISTED - {b"vary"}
                headers += [
                    (b"access-control-allow-origin", self.origin.encode("latin-1")),
                    (b"access-control-expose-headers", b", ".join(sorted(exposed.union(_OURS)))),
                ]
            headers.append((b"vary", b"Origin"))
            message = {**message, "headers": headers}
        await self.send(message)
