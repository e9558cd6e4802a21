"""Client tokens: short-lived, scoped credentials that a project's backend mints for its pages and apps.

Signed, not stored: `cgc_<payload>.<tag>`, the payload a compact JSON of the grant, the tag an HMAC under a key
derived from the master key. So minting writes nothing (a page load can mint), every worker and instance
checks a token alone, and a token checked once is remembered. A token names the hash of the project token that
minted it; the proxy looks that hash up as it would the project token itself, so a client token dies with it
(rotation past its grace, revocation, project deletion), at no cost beyond the project token's own lookup.
"""

import base64
import binascii
import json
import re
from dataclasses import dataclass, field

from credgate.crypto import KeyRing
from credgate.paths import AllowList
from credgate.specs import Endpoint

CLIENT_TOKEN_PREFIX = "cgc_"  # noqa: S105 - a public prefix, not a secret
DEFAULT_TTL_SECONDS = 900
MAX_TTL_SECONDS = 86_400
_PURPOSE = b"client token"
# Headers are bounded too (CREDGATE_MAX_HEADER_BYTES): minting refuses a scope that would not fit (TooLarge).
MAX_TOKEN_LENGTH = 4096
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")
_TAG_LENGTH = 48  # 36 bytes (key id and HMAC-SHA256), base64url


@dataclass(frozen=True, slots=True)
class ClientGrant:
    """What a client token allows. None in a scope field: as much as the project allows."""

    project_id: str
    minted_by: str  # the minting project token's hash
    expires_at: float  # seconds since the epoch, to the millisecond (older tokens: whole seconds)
    subject: str | None = None
    providers: frozenset[str] | None = None
    endpoints: tuple[Endpoint, ...] | None = None
    origins: frozenset[str] | None = None
    tag: bytes = b""  # the signature, read: its master key must still be the ring's at each use
    _allow_list: AllowList | None = field(init=False, repr=False, compare=False)  # `endpoints`, compiled

    def __post_init__(self) -> None:
        object.__setattr__(self, "_allow_list", None if self.endpoints is None else AllowList(self.endpoints))

    def covers(self, provider: str, method: str, segments: tuple[str, ...]) -> bool:
        """Whether the request is within the token's providers and endpoints (the integration's are checked too)."""
        if self.providers is not None and provider not in self.providers:
            return False
        return self._allow_list is None or self._allow_list.admits(method, segments)

    def admits_origin(self, origin: str) -> bool:
        return self.origins is None or origin in self.origins


class TooLarge(ValueError):
    """The grant's scope does not fit in a token a client can send."""


def mint(keyring: KeyRing, grant: ClientGrant) -> str:
    claims: dict[str, object] = {"p": grant.project_id, "m": grant.minted_by, "x": grant.expires_at}
    if grant.subject is not None:
        claims["s"] = grant.subject
    if grant.providers is not None:
        claims["v"] = sorted(grant.providers)
    if grant.endpoints is not None:
        claims["e"] = [[endpoint.method, endpoint.path] for endpoint in grant.endpoints]
    if grant.origins is not None:
        claims["o"] = sorted(grant.origins)
    payload = _encode(json.dumps(claims, separators=(",", ":")).encode())
    signed = CLIENT_TOKEN_PREFIX + payload
    token = f"{signed}.{_encode(keyring.tag(signed.encode(), purpose=_PURPOSE))}"
    if len(token) > MAX_TOKEN_LENGTH:
        raise TooLarge(f"the scope makes a token over {MAX_TOKEN_LENGTH} characters; name fewer endpoints or origins")
    return token


def read(keyring: KeyRing, token: str) -> ClientGrant | None:
    """The grant of a token this gateway minted; None for anything else (malformed, forged, altered). Whether
    it has expired is the caller's question, asked on every use."""
    if len(token) > MAX_TOKEN_LENGTH:
        return None
    signed, dot, tag = token.rpartition(".")
    payload = signed[len(CLIENT_TOKEN_PREFIX) :]
    # Exactly as minted, or nothing: a lenient decoder would take many spellings of one token.
    if not dot or not signed.startswith(CLIENT_TOKEN_PREFIX) or len(tag) != _TAG_LENGTH:
        return None
    if not _BASE64URL.fullmatch(payload) or not _BASE64URL.fullmatch(tag) or _encode(_decode(payload)) != payload:
        return None
    try:
        signature = _decode(tag)
        if not keyring.check_tag(signed.encode(), signature, purpose=_PURPOSE):
            return None
        claims = json.loads(_decode(payload))
        providers, endpoints, origins = claims.get("v"), claims.get("e"), claims.get("o")
        return ClientGrant(
            project_id=claims["p"],
            minted_by=claims["m"],
            expires_at=claims["x"],
            subject=claims.get("s"),
            providers=None if providers is None else frozenset(providers),
            endpoints=None if endpoints is None else tuple(Endpoint(method=m, path=p) for m, p in endpoints),
            origins=None if origins is None else frozenset(origins),
            tag=signature,
        )
    except (ValueError, KeyError, TypeError, binascii.Error):
        # Only a payload this gateway signed gets here: a failure is a bug, but never a token accepted.
        return None


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
