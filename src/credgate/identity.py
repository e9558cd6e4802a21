"""End users' identity tokens: JWTs from an app's own sign-in, verified against the identity provider's JWKS.

A pure domain module: the JWKS is fetched through an injected callable (the caller's SSRF-guarded client) and
time comes from an injected clock, so rotation and expiry are tested without a network or sleeping.

Refusal messages are fixed words ("expired", "wrong audience", …): they may reach the client and the logs, so
they never quote the token or a claim's value. PyJWT's own messages can (a kid, a key's JSON), hence the
`from None` wherever one of its errors is turned into ours.
"""

import asyncio
import functools
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import jwt
from jwt import PyJWK

from credgate.limits import MAX_SUBJECT_LENGTH, check_subject
from credgate.resolved import IdentityProvider

__all__ = ["MAX_SUBJECT_LENGTH", "IdentityProvider", "IdentityRefused", "IdentityUnavailable", "IdentityVerifier"]

# Asymmetric only: accepting an HMAC "alg" would let a token use the *published* public key as its secret.
_ALGORITHMS = ("RS256", "ES256")
_MAX_TOKEN_LENGTH = 16_384  # real tokens are a few KB; this bounds the parsing and the remembered tokens' memory
_MAX_KEYS = 100  # providers publish two or three; a huge set is a misconfiguration or an attack
_JWT_SHAPE = re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_DECODE_OPTIONS: jwt.types.Options = {
    "require": ["iss", "aud"],
    # Times are checked against the injected clock, and the subject with its own message.
    "verify_exp": False,
    "verify_nbf": False,
    "verify_iat": False,
    "verify_sub": False,
    "enforce_minimum_key_length": True,
}

_log = logging.getLogger(__name__)

Fetch: TypeAlias = Callable[[str], Awaitable[bytes]]  # the JWKS document's bytes at a URL; raises on any failure


class IdentityRefused(Exception):
    """The token is not accepted; the message says why in a few words, never quoting the token or a claim's value."""


class IdentityUnavailable(Exception):
    """The identity provider's keys could not be fetched (network, bad JSON): not the client's fault (answered 503)."""


def looks_like_jwt(value: str) -> bool:
    """A cheap syntactic test (three base64url parts, a JSON header), to tell a JWT from another kind of token."""
    return len(value) <= _MAX_TOKEN_LENGTH and _JWT_SHAPE.fullmatch(value) is not None


def unverified_issuer_and_audiences(token: str) -> tuple[str, tuple[str, ...]] | None:
    """The token's `iss` and `aud`, read WITHOUT verifying: only to find which project trusts this issuer."""
    if len(token) > _MAX_TOKEN_LENGTH:
        return None
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    issuer, audience = claims.get("iss"), claims.get("aud", [])
    if not isinstance(issuer, str) or not issuer:
        return None
    audiences = [audience] if isinstance(audience, str) else audience
    if not isinstance(audiences, list) or not all(isinstance(item, str) for item in audiences):
        return None
    return issuer, tuple(audiences)


@dataclass(frozen=True, slots=True, eq=False)
class _KeySet:
    by_kid: dict[str, PyJWK]
    sole: PyJWK | None  # the only usable key, which alone may verify a token without a kid
    fetched_at: float

    def find(self, kid: str | None) -> PyJWK | None:
        return self.sole if kid is None else self.by_kid.get(kid)


@dataclass(frozen=True, slots=True)
class _Remembered:
    subject: str
    expires_at: float
    keys: _KeySet  # the set that verified it: once replaced or stale, the token is verified again


class IdentityVerifier:
    """Verifies identity tokens; caches each provider's keys and remembers the tokens already verified."""

    def __init__(
        self,
        fetch: Fetch,
        *,
        clock: Callable[[], float] = time.time,
        leeway_seconds: float = 30,
        min_refetch_seconds: float = 30,
        keys_max_age_seconds: float = 600,
        max_remembered: int = 10_000,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._leeway = leeway_seconds
        self._min_refetch = min_refetch_seconds
        self._keys_max_age = keys_max_age_seconds
        self._max_remembered = max_remembered
        self._key_sets: dict[str, _KeySet] = {}
        self._fetches: dict[str, asyncio.Task[_KeySet]] = {}  # in flight, shared by every waiter (single flight)
        self._last_fetch_at: dict[str, float] = {}
        self._failed_at: dict[str, float] = {}  # the last failed fetch of a provider whose keys were never fetched
        self._remembered: dict[tuple[str, IdentityProvider], _Remembered] = {}

    async def subject(self, token: str, provider: IdentityProvider) -> str:
        """The verified `sub` of `token`; raises IdentityRefused or IdentityUnavailable."""
        remembered = self._remembered.get((token, provider))
        if remembered is not None:
            now = self._clock()
            if self._has_expired(remembered.expires_at, now):
                del self._remembered[(token, provider)]
                raise IdentityRefused("expired")
            if self._key_sets.get(provider.jwks_url) is remembered.keys and self._is_fresh(remembered.keys, now):
                return remembered.subject
        algorithm, kid = _signing_header(token)
        keys = await self._keys_for(provider.jwks_url, kid)
        key = keys.find(kid)
        if key is None:
            raise IdentityRefused("unknown signing key")
        claims = _verified_claims(token, key, algorithm, provider)
        expires_at = self._checked_expiry(claims, self._clock())
        subject = _checked_subject(claims)
        if len(self._remembered) >= self._max_remembered:
            self._remembered.clear()  # cheaper than an LRU, and refilled by one verification per live token
        self._remembered[(token, provider)] = _Remembered(subject, expires_at, keys)
        return subject

    def _is_fresh(self, keys: _KeySet, now: float) -> bool:
        return now - keys.fetched_at < self._keys_max_age

    def _has_expired(self, expires_at: float, now: float) -> bool:
        return expires_at + self._leeway <= now

    def _checked_expiry(self, claims: dict[str, Any], now: float) -> float:
        if "exp" not in claims:
            raise IdentityRefused("no expiry")
        expires_at = _timestamp(claims["exp"])
        if self._has_expired(expires_at, now):
            raise IdentityRefused("expired")
        if "nbf" in claims and _timestamp(claims["nbf"]) - self._leeway > now:
            raise IdentityRefused("not yet valid")
        return expires_at

    async def _keys_for(self, url: str, kid: str | None) -> _KeySet:
        cached = self._key_sets.get(url)
        if cached is None:
            # A provider that could not be reached is asked again at most once per min_refetch_seconds: tokens
            # that name it (their iss and aud are public) must not become a stream of outbound fetches.
            failed_at = self._failed_at.get(url)
            if url not in self._fetches and failed_at is not None and self._clock() - failed_at < self._min_refetch:
                raise IdentityUnavailable("identity provider unavailable")
            return await self._refresh(url)
        now = self._clock()
        wanted = not self._is_fresh(cached, now) or cached.find(kid) is None
        # Rotation refetches at once, but at most once per min_refetch_seconds: made-up kids cannot hammer the
        # identity provider. A fetch already in flight is joined rather than counted. The first fetch does not
        # count: a key published just after it (a rotation) is found at its first use.
        may_fetch = url in self._fetches or now - self._last_fetch_at.get(url, -math.inf) >= self._min_refetch
        if not (wanted and may_fetch):
            return cached
        if url not in self._fetches:
            self._last_fetch_at[url] = now
        try:
            return await self._refresh(url)
        except IdentityUnavailable:
            return cached  # the provider is down: its last keys are still the best answer (the failure is logged)

    async def _refresh(self, url: str) -> _KeySet:
        task = self._fetches.get(url)
        if task is None:
            task = asyncio.create_task(self._fetch_keys(url))
            self._fetches[url] = task
            task.add_done_callback(functools.partial(self._forget_fetch, url))
        # Shielded: one waiter's cancellation (a client that went away) must not cancel the others' fetch.
        return await asyncio.shield(task)

    def _forget_fetch(self, url: str, task: asyncio.Task[_KeySet]) -> None:
        if self._fetches.get(url) is task:
            del self._fetches[url]
        if not task.cancelled():
            task.exception()  # retrieved even when every waiter was cancelled, so asyncio does not complain

    async def _fetch_keys(self, url: str) -> _KeySet:
        try:
            body = await self._fetch(url)
        except Exception as error:  # the fetch's contract: it raises on any failure, of whatever kind
            _log.warning("identity provider keys not fetched from %s: %s", url, type(error).__name__)
            self._note_failure(url)
            raise IdentityUnavailable("identity provider unavailable") from error
        try:
            keys = _parse_key_set(body, fetched_at=self._clock())
        except ValueError as error:
            _log.warning("identity provider keys from %s refused: %s", url, error)
            self._note_failure(url)
            raise IdentityUnavailable("identity provider unavailable") from error
        self._key_sets[url] = keys
        self._failed_at.pop(url, None)
        return keys

    def _note_failure(self, url: str) -> None:
        if len(self._failed_at) >= _MAX_KEYS * 100:
            self._failed_at.clear()
        self._failed_at[url] = self._clock()


def _signing_header(token: str) -> tuple[str, str | None]:
    """The token's algorithm and key id, checked before any key is fetched."""
    if len(token) > _MAX_TOKEN_LENGTH:
        raise IdentityRefused("malformed token")
    try:
        header = jwt.get_unverified_header(token)  # also checks that a kid, when present, is a string
    except jwt.PyJWTError:
        raise IdentityRefused("malformed token") from None
    algorithm = header.get("alg")
    if algorithm not in _ALGORITHMS:
        raise IdentityRefused("unsupported algorithm")
    return algorithm, header.get("kid")


def _verified_claims(token: str, key: PyJWK, algorithm: str, provider: IdentityProvider) -> dict[str, Any]:
    if key.algorithm_name != algorithm:
        raise IdentityRefused("unsupported algorithm")  # e.g. an ES256 token naming an RSA key's kid
    try:
        return jwt.decode(
            token,
            key,
            algorithms=list(_ALGORITHMS),
            options=_DECODE_OPTIONS,
            issuer=provider.issuer,
            audience=provider.audience,
        )
    except jwt.InvalidSignatureError:
        raise IdentityRefused("bad signature") from None
    except jwt.InvalidIssuerError:
        raise IdentityRefused("wrong issuer") from None
    except jwt.InvalidAudienceError:
        raise IdentityRefused("wrong audience") from None
    except jwt.MissingRequiredClaimError as error:
        raise IdentityRefused("wrong issuer" if error.claim == "iss" else "wrong audience") from None
    except jwt.InvalidAlgorithmError:
        raise IdentityRefused("unsupported algorithm") from None
    except jwt.PyJWTError:
        raise IdentityRefused("malformed token") from None


def _timestamp(value: object) -> float:
    # bool is an int, and Python's JSON accepts NaN and Infinity: none of them is a time.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise IdentityRefused("malformed token")
    return float(value)


def _checked_subject(claims: dict[str, Any]) -> str:
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise IdentityRefused("no subject")
    try:
        return check_subject(subject)
    except ValueError:
        raise IdentityRefused("bad subject") from None


def _parse_key_set(body: bytes, *, fetched_at: float) -> _KeySet:
    """The usable signing keys of a JWKS document; raises ValueError when the document itself is wrong."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError('no "keys" list')
    if len(entries) > _MAX_KEYS:
        raise ValueError("too many keys")
    usable = [key for key in map(_usable_key, entries) if key is not None]
    by_kid: dict[str, PyJWK] = {}
    for key in usable:
        if isinstance(key.key_id, str):
            by_kid.setdefault(key.key_id, key)
    return _KeySet(by_kid, usable[0] if len(usable) == 1 else None, fetched_at)


def _usable_key(entry: object) -> PyJWK | None:
    """A signing key we may verify with, or None: a JWKS may also hold encryption keys, other types, junk."""
    if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
        return None
    try:
        key = PyJWK(entry)
        if key.algorithm_name not in _ALGORITHMS or key.Algorithm.check_key_length(key.key) is not None:
            return None  # another algorithm, or a key too weak to trust (RSA under 2048 bits)
    except Exception:  # PyJWT raises several kinds on odd key data; one bad key must not sink the set
        return None
    return key
