"""Plan: the pure half of the data plane. From the client's request and the resolved integration to the
exact upstream request; no I/O, so every hygiene rule is unit-tested without a network.
"""

import base64
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple
from urllib.parse import quote, unquote, unquote_to_bytes

from credgate import specs
from credgate.client_tokens import ClientGrant
from credgate.crypto import Secret
from credgate.errors import BadRequest, Forbidden, MethodNotAllowed, NotFound, PayloadTooLarge
from credgate.paths import MalformedPath, parse_path
from credgate.resolved import ResolvedIntegration
from credgate.specs import PROVIDER_NAME, AuthSpec

Headers = list[tuple[bytes, bytes]]

# Where SDKs carry a credential; the project token is looked for in each, and none of them goes upstream.
TOKEN_HEADERS = frozenset({b"authorization", b"x-api-key", b"api-key", b"x-goog-api-key", b"xi-api-key"})
_TOKEN_SCHEMES = (b"bearer ", b"token ")
_AWS_SIGNATURE = b"AWS4-HMAC-SHA256 "
_TOKEN_PREFIXES = (b"cgp_", b"cgc_")  # project and client tokens
# An end user's identity token is a JWT, whose header is base64url JSON (`{"…`).
IDENTITY_TOKEN_PREFIX = "eyJ"  # noqa: S105 - a public prefix, not a secret
_IDENTITY_TOKEN_PREFIX = IDENTITY_TOKEN_PREFIX.encode()
# What the proxy forwards at all (README, Proxy); anything else gets 405 with this Allow header.
FORWARDED_METHODS = frozenset({*specs.METHODS, "HEAD", "OPTIONS"})
ALLOW_HEADER = ", ".join((*specs.METHODS, "HEAD", "OPTIONS"))
HOP_BY_HOP = frozenset(name.encode() for name in specs.HOP_BY_HOP)
# Not sent upstream: credentials, cookies, the client's address, and what the transport sets itself.
_DROPPED_REQUEST_HEADERS = (
    HOP_BY_HOP
    | TOKEN_HEADERS
    | {
        b"cookie",
        b"host",
        b"content-length",
        b"forwarded",
        b"x-real-ip",
        b"true-client-ip",
        b"cf-connecting-ip",
        b"expect",
    }
)
# An upstream may not pass for credgate (only its own errors carry X-Credgate-Error), nor confuse its request id.
_DROPPED_RESPONSE_HEADERS = HOP_BY_HOP | {b"x-credgate-error", b"x-credgate-request-id"}
# Response headers that may quote the upstream URL back, and with it a key placed in the query.
_URL_HEADERS = frozenset({b"location", b"content-location", b"link", b"refresh"})


def canonical_header(name: bytes) -> bytes:
    """The one spelling every hygiene rule compares: lowercase, with `_` read as `-`, since servers that fold
    underscores (nginx with underscores_in_headers, WSGI, CGI) would take `x_api_key` for `x-api-key`."""
    return name.lower().replace(b"_", b"-")


class _CanonicalNames(dict[bytes, bytes]):
    """canonical_header of the header names seen, remembered: a request's and its response's dozen names cost a
    dict lookup each instead of a call making two new bytes objects (about a fifth of the planning's
    instructions). Bounded: 1,024 names of at most 64 bytes (under 300 KB); past them (a client or upstream
    making names up), a name is computed each time."""

    def __missing__(self, name: bytes) -> bytes:
        canonical = canonical_header(name)
        if len(self) < 1024 and len(name) <= 64:
            self[name] = canonical
        return canonical


_canonical = _CanonicalNames()


def check_method(method: str) -> None:
    """405 for a method the proxy never forwards, before the token is even looked at."""
    if method not in FORWARDED_METHODS:
        raise MethodNotAllowed(f"{method} is never forwarded", headers={"Allow": ALLOW_HEADER})


def find_token(headers: Headers) -> str | None:
    """The first credgate token in the headers SDKs use for credentials, with or without a scheme: a project
    token (`cgp_`) or a client token (`cgc_`), else an end user's identity token (a JWT, `eyJ…`: a client may
    send a JWT of another service's beside its credgate token). An AWS SDK
    given the token as its access key id signs with it: the token is then the signature's credential scope's
    first part (`AWS4-HMAC-SHA256 Credential=<token>/<date>/…`); that signature is never checked or relayed."""
    identity = None
    for name, value in headers:
        if _canonical[name] in TOKEN_HEADERS:
            lowered = value[:7].lower()
            for scheme in _TOKEN_SCHEMES:
                if lowered.startswith(scheme):
                    value = value[len(scheme) :]
                    break
            else:
                if value.startswith(_AWS_SIGNATURE):
                    value = value[len(_AWS_SIGNATURE) :].lstrip().removeprefix(b"Credential=").partition(b"/")[0]
            value = value.strip()
            if value.startswith(_TOKEN_PREFIXES):
                return value.decode("latin-1")
            if identity is None and value.startswith(_IDENTITY_TOKEN_PREFIX):
                identity = value.decode("latin-1")
    return identity


def split_target(raw_path: bytes) -> tuple[str, str]:
    """`/proxy/<provider>/<endpoint>` → (provider, raw endpoint); the endpoint keeps its percent-encoding."""
    rest = raw_path[len(b"/proxy/") :].decode("latin-1")
    provider, _, endpoint = rest.partition("/")
    return provider, endpoint


def check_target(provider: str, raw_endpoint: str) -> tuple[str, ...]:
    """The endpoint's decoded segments; BadRequest for a bad provider name or an endpoint that could leave
    the integration's base path (see credgate.paths)."""
    if not PROVIDER_NAME.fullmatch(provider):
        raise BadRequest("malformed provider name")
    if not raw_endpoint:
        raise BadRequest("empty endpoint")
    try:
        return parse_path(raw_endpoint)
    except MalformedPath:
        raise BadRequest("malformed endpoint") from None


class Admitted(NamedTuple):
    """A request that passed the checks after the token: its integration, credential and declared length."""

    integration: ResolvedIntegration
    credential: Secret
    declared_length: int | None


def admit(
    *,
    method: str,
    provider: str,
    raw_endpoint: str,
    headers: Headers,
    integration: ResolvedIntegration | None,
    max_request_bytes: int,
    grant: ClientGrant | None = None,
    origin: str | None = None,
    allowed_origins: frozenset[str] = frozenset(),
) -> Admitted:
    """The documented checks after the token (README, Errors), in their order: 400 (target), 404 (no integration),
    403 (disabled, key revoked, endpoint not enabled, outside a client token's scope, a page's origin not
    allowed), 413 (declared length). The rate limit (429) comes after, in the relay, since it counts."""
    segments = check_target(provider, raw_endpoint)
    if integration is None:
        raise NotFound(f"this project has no integration {provider}")
    if not integration.enabled:
        raise Forbidden(f"integration {provider} is disabled")
    credential = integration.credential
    if credential is None:
        raise Forbidden(f"the provider key of {provider} is revoked; set a new key")
    if method not in specs.METHODS or not integration.allow_list.admits(method, segments):
        raise Forbidden(f"{method} {'/'.join(segments)} is not an enabled endpoint of {provider}")
    if grant is not None and not grant.covers(provider, method, segments):
        raise Forbidden(f"{method} {'/'.join(segments)} of {provider} is outside this client token's scope")
    if origin is not None and not origin_allowed(origin, allowed_origins, grant):
        raise Forbidden("this page's origin is not allowed to call this project")
    length = content_length(headers)
    if length is not None and length > max_request_bytes:
        raise PayloadTooLarge(f"request body over the limit of {max_request_bytes} bytes")
    return Admitted(integration=integration, credential=credential, declared_length=length)


def origin_allowed(origin: str, allowed_origins: frozenset[str], grant: ClientGrant | None) -> bool:
    """Whether a page of `origin` may call: listed by the project, and by the client token when it names some."""
    return origin in allowed_origins and (grant is None or grant.admits_origin(origin))


def content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class UpstreamRequest(NamedTuple):
    """The request to send upstream. A NamedTuple, as Admitted: a request makes one of each, and a frozen
    dataclass's fields cost an object.__setattr__ each (1.3 µs against 0.7 for this tuple)."""

    method: str
    url: str  # already percent-encoded: sent exactly as written
    headers: list[tuple[str, str]]
    query_secrets: tuple[str, ...] = ()  # a key placed in the query, as written and as encoded


Placement = tuple[list[tuple[str, str]], list[tuple[str, str]]]  # (headers, query parameters)


def _bearer(spec: AuthSpec, key: str) -> Placement:
    return [("Authorization", f"Bearer {key}")], []


def _header(spec: AuthSpec, key: str) -> Placement:
    return [(spec.name, f"{spec.prefix}{key}")], []  # type: ignore[union-attr]


def _query(spec: AuthSpec, key: str) -> Placement:
    return [], [(spec.name, key)]  # type: ignore[union-attr]


def _basic(spec: AuthSpec, key: str) -> Placement:
    return [("Authorization", "Basic " + base64.b64encode(key.encode()).decode())], []


# Resolved once per request by the auth method's name: no chain of ifs on the hot path.
PLACEMENTS: dict[str, Callable[[AuthSpec, str], Placement]] = {
    "bearer": _bearer,
    "header": _header,
    "query": _query,
    "basic": _basic,
    # The credential of an OAuth 2.0 integration is the access token the relay obtained for it.
    "oauth2_client_credentials": _bearer,
    "oauth2_refresh_token": _bearer,
    "google_service_account": _bearer,
    # A signature covers the body, so the relay signs once the body is read (proxy/sigv4.py).
    "aws_sigv4": lambda spec, key: ([], []),
}


def plan_upstream(
    *,
    method: str,
    raw_endpoint: str,
    query_string: bytes,
    headers: Headers,
    integration: ResolvedIntegration,
    credential: Secret,
    client_token: str | None = None,
) -> UpstreamRequest:
    """The upstream request: the client's end-to-end headers and query, the integration's defaults where the
    client sent none, and the credential placed exactly once by the auth method. The client's token goes
    nowhere: a header or query pair that quotes it, wherever the client put it, is left out."""
    placed_headers, placed_query = PLACEMENTS[integration.auth.method](integration.auth, credential.reveal())
    placed = [_canonical[name.encode()] for name, _ in placed_headers]
    withheld = client_token.encode("latin-1") if client_token else None
    upstream_headers = []
    sent = set()
    named: set[bytes] | None = None  # end-to-end headers a Connection header names
    for name, value in headers:
        canonical = _canonical[name]
        if (
            canonical in _DROPPED_REQUEST_HEADERS
            or canonical in placed
            or canonical.startswith(b"x-forwarded-")
            or (withheld and withheld in value)
        ):
            if canonical == b"connection":
                named = _named_by_connection(value, _DROPPED_REQUEST_HEADERS, named)
            continue
        upstream_headers.append((name.decode("latin-1"), value.decode("latin-1")))
        sent.add(canonical)
    if named:
        upstream_headers = [
            header for header in upstream_headers if _canonical[header[0].encode("latin-1")] not in named
        ]
    if integration.headers:
        excluded = sent.union(_DROPPED_REQUEST_HEADERS, placed, named or ())
        upstream_headers += [
            (name, value) for name, value in integration.headers.items() if _canonical[name.encode()] not in excluded
        ]
    upstream_headers += placed_headers
    url = f"{integration.base_url}/{raw_endpoint}"
    query = _merge_query(query_string, integration.query, placed_query, withheld=client_token)
    return UpstreamRequest(
        method=method,
        url=f"{url}?{query}" if query else url,
        headers=upstream_headers,
        query_secrets=tuple(form for _, value in placed_query for form in (value, quote(value, safe=""))),
    )


def _merge_query(
    client: bytes, defaults: dict[str, str], placed: list[tuple[str, str]], *, withheld: str | None = None
) -> str:
    """The client's query verbatim, then defaults it did not set, then the credential (replacing any copy)."""
    query = client.decode("latin-1")
    quoting = withheld is not None and _quotes(query, withheld)
    if not defaults and not placed and not quoting:
        return query  # the common case: exactly as received, empty pairs and all
    replaced = {name for name, _ in placed}
    pairs = query.split("&") if query else []
    kept = [
        pair
        for pair in pairs
        if not pair or (_query_name(pair) not in replaced and not (withheld and _quotes(pair, withheld)))
    ]
    sent = {_query_name(pair) for pair in kept if pair}
    added = [_encode_pair(name, value) for name, value in defaults.items() if name not in sent | replaced]
    added += [_encode_pair(name, value) for name, value in placed]
    return "&".join(kept + added)


def _quotes(text: str, value: str) -> bool:
    return value in (unquote(text) if "%" in text else text)


def _query_name(pair: str) -> str:
    return unquote_to_bytes(pair.partition("=")[0].replace("+", " ")).decode("utf-8", "replace")


def _encode_pair(name: str, value: str) -> str:
    return f"{quote(name, safe='')}={quote(value, safe='')}"


def _named_by_connection(value: bytes, dropped: frozenset[bytes], named: set[bytes] | None) -> set[bytes]:
    """`named`, and the headers a `Connection` header's `value` names (hop-by-hop for this connection only) that
    are not `dropped` anyway. Rarely any: "keep-alive" is the usual value. A header it names may come before it,
    so the caller filters what it kept once all are read."""
    tokens = {canonical_header(token.strip()) for token in value.split(b",")} - dropped
    return tokens if named is None else named | tokens


def response_headers(raw: Iterable[tuple[bytes, bytes]], *, secrets: Sequence[str] = ()) -> Headers:
    """The upstream's end-to-end headers; framing is the server's own business, not relayed. A key placed in
    the query is cut out of any header that quotes the URL back (a redirect's Location, say)."""
    relayed = []
    named: set[bytes] | None = None
    for name, value in raw:
        canonical = _canonical[name]
        if canonical in _DROPPED_RESPONSE_HEADERS:
            if canonical == b"connection":
                named = _named_by_connection(value, _DROPPED_RESPONSE_HEADERS, named)
            continue
        if secrets and canonical in _URL_HEADERS:
            for secret in secrets:
                value = value.replace(secret.encode("latin-1", "replace"), b"REDACTED")
        relayed.append((name, value))
    if named:
        relayed = [(name, value) for name, value in relayed if _canonical[name] not in named]
    return relayed
