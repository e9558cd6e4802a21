"""Identity tokens verified against a JWKS: algorithms, claims, the keys' cache, rotation and single flight."""

import asyncio
import base64
import functools
import hashlib
import hmac
import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from credgate.identity import (
    MAX_SUBJECT_LENGTH,
    IdentityProvider,
    IdentityRefused,
    IdentityUnavailable,
    IdentityVerifier,
    looks_like_jwt,
    unverified_issuer_and_audiences,
)

NOW = 1_700_000_000.0
SUBJECT = "auth0|user-7f3a9c"
PROVIDER = IdentityProvider(
    jwks_url="https://id.example/.well-known/jwks.json", issuer="https://id.example/", audience="app-123"
)
# Every refusal must be one of these fixed words: never the token, never a claim's value.
MESSAGES = {
    "expired",
    "not yet valid",
    "wrong issuer",
    "wrong audience",
    "bad signature",
    "unsupported algorithm",
    "unknown signing key",
    "malformed token",
    "no subject",
    "bad subject",
    "no expiry",
}


@functools.cache
def rsa_private_key(name: str) -> rsa.RSAPrivateKey:
    # A name starting with "weak" gets a key below the 2048 bits a verifier should demand.
    return rsa.generate_private_key(public_exponent=65537, key_size=1024 if name.startswith("weak") else 2048)


@functools.cache
def ec_private_key(name: str) -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@dataclass(frozen=True)
class SigningKey:
    kid: str
    alg: str = "RS256"
    key_name: str = ""  # two SigningKeys with the same key_name share a private key

    @property
    def private(self) -> rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey:
        name = self.key_name or self.kid
        return rsa_private_key(name) if self.alg == "RS256" else ec_private_key(name)

    def jwk(self) -> dict[str, Any]:
        public = self.private.public_key()
        published = (
            RSAAlgorithm.to_jwk(public, as_dict=True)
            if isinstance(public, rsa.RSAPublicKey)
            else ECAlgorithm.to_jwk(public, as_dict=True)
        )
        return {**published, "kid": self.kid, "alg": self.alg, "use": "sig"}

    def sign(self, *, drop: tuple[str, ...] = (), with_kid: bool = True, **claims: object) -> str:
        payload = {"iss": PROVIDER.issuer, "aud": PROVIDER.audience, "sub": SUBJECT, "iat": NOW, "exp": NOW + 3600}
        payload = {name: value for name, value in (payload | claims).items() if name not in drop}
        headers = {"kid": self.kid} if with_kid else {}
        # Signed as raw JWS: jwt.encode would refuse to write some of the bad claims these tests need.
        return jwt.api_jws.encode(json.dumps(payload).encode(), self.private, algorithm=self.alg, headers=headers)


RS = SigningKey("rs-1")
ES = SigningKey("es-1", alg="ES256")


@dataclass
class Clock:
    now: float = NOW

    def __call__(self) -> float:
        return self.now


@dataclass
class Jwks:
    """The identity provider's published key set, fetched through an async callable that counts its calls."""

    keys: list[Any] = field(default_factory=lambda: [RS.jwk(), ES.jwk()])
    body: bytes | None = None  # served instead of the keys when set
    failing: bool = False
    fetches: int = 0
    urls: list[str] = field(default_factory=list)

    async def __call__(self, url: str) -> bytes:
        self.fetches += 1
        self.urls.append(url)
        await asyncio.sleep(0)  # a real fetch yields: that is what lets concurrent verifications overlap
        if self.failing:
            raise OSError("connection refused")
        return self.body if self.body is not None else json.dumps({"keys": self.keys}).encode()


def verifier(jwks: Jwks, clock: Clock | None = None, **options: Any) -> IdentityVerifier:
    return IdentityVerifier(jwks, clock=clock or Clock(), **options)


async def refusal(identity: IdentityVerifier, token: str, provider: IdentityProvider = PROVIDER) -> str:
    with pytest.raises(IdentityRefused) as refused:
        await identity.subject(token, provider)
    message = str(refused.value)
    assert message in MESSAGES
    assert SUBJECT not in message
    assert not token or token not in message
    return message


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(header: dict[str, Any], payload: dict[str, Any], signature: bytes = b"") -> str:
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}.{b64(signature)}"


CLAIMS = {"iss": PROVIDER.issuer, "aud": PROVIDER.audience, "sub": SUBJECT, "exp": NOW + 3600}


# --- valid tokens ---


@pytest.mark.parametrize("key", [RS, ES], ids=["RS256", "ES256"])
async def test_a_valid_token_gives_its_subject(key: SigningKey) -> None:
    jwks = Jwks()
    assert await verifier(jwks).subject(key.sign(), PROVIDER) == SUBJECT
    assert jwks.urls == [PROVIDER.jwks_url]


async def test_an_audience_list_containing_ours_is_accepted() -> None:
    token = RS.sign(aud=["other-app", PROVIDER.audience])
    assert await verifier(Jwks()).subject(token, PROVIDER) == SUBJECT


async def test_a_token_without_kid_is_accepted_only_when_the_set_has_one_usable_key() -> None:
    token = RS.sign(with_kid=False)
    assert await verifier(Jwks(keys=[RS.jwk()])).subject(token, PROVIDER) == SUBJECT
    assert await refusal(verifier(Jwks(keys=[RS.jwk(), ES.jwk()])), token) == "unknown signing key"


async def test_keys_that_cannot_be_used_are_skipped_not_fatal() -> None:
    junk = [
        "not an object",
        {"kty": "oct", "k": b64(b"0" * 32), "kid": "hmac", "alg": "HS256"},
        {**RS.jwk(), "kid": "enc", "use": "enc"},
        {"kty": "RSA", "kid": "broken", "n": "!!", "e": "AQAB"},
        {"kty": "unknown", "kid": "odd"},
        {**SigningKey("rs-384", key_name="rs-1").jwk(), "alg": "RS384"},
        SigningKey("weak").jwk(),
    ]
    identity = verifier(Jwks(keys=[*junk, RS.jwk()]))
    assert await identity.subject(RS.sign(), PROVIDER) == SUBJECT
    assert await identity.subject(RS.sign(with_kid=False), PROVIDER) == SUBJECT  # the only usable key
    for kid in ("hmac", "enc", "broken", "odd", "rs-384", "weak"):
        assert await refusal(identity, SigningKey(kid, key_name="rs-1").sign()) == "unknown signing key"


async def test_a_subject_of_the_maximum_length_is_accepted() -> None:
    subject = "s" * MAX_SUBJECT_LENGTH
    assert await verifier(Jwks()).subject(RS.sign(sub=subject), PROVIDER) == subject


# --- time, against the injected clock ---


@pytest.mark.parametrize(("offset", "accepted"), [(-1, True), (0, False), (3600, False)])
async def test_expiry_allows_the_leeway_and_no_more(offset: float, accepted: bool) -> None:
    clock = Clock(NOW + 3600 + 30 + offset)  # exp is NOW + 3600, the leeway 30 seconds
    identity = verifier(Jwks(), clock, leeway_seconds=30)
    if accepted:
        assert await identity.subject(RS.sign(), PROVIDER) == SUBJECT
    else:
        assert await refusal(identity, RS.sign()) == "expired"


@pytest.mark.parametrize(("nbf", "accepted"), [(NOW + 29, True), (NOW + 31, False), (NOW - 60, True)])
async def test_not_before_allows_the_leeway_and_no_more(nbf: float, accepted: bool) -> None:
    identity = verifier(Jwks(), leeway_seconds=30)
    if accepted:
        assert await identity.subject(RS.sign(nbf=nbf), PROVIDER) == SUBJECT
    else:
        assert await refusal(identity, RS.sign(nbf=nbf)) == "not yet valid"


async def test_issued_at_is_neither_required_nor_checked_against_the_real_time() -> None:
    assert await verifier(Jwks()).subject(RS.sign(drop=("iat",)), PROVIDER) == SUBJECT


async def test_a_token_without_expiry_is_refused() -> None:
    assert await refusal(verifier(Jwks()), RS.sign(drop=("exp",))) == "no expiry"


@pytest.mark.parametrize("exp", ["tomorrow", True, None], ids=["string", "bool", "null"])
async def test_an_expiry_that_is_not_a_number_is_refused(exp: object) -> None:
    assert await refusal(verifier(Jwks()), RS.sign(exp=exp)) in {"malformed token", "no expiry"}


async def test_an_infinite_expiry_is_refused() -> None:
    token = RS.sign(exp=float("inf"))  # Python's JSON writes and reads Infinity
    assert await refusal(verifier(Jwks()), token) == "malformed token"


async def test_a_remembered_token_is_refused_once_expired_by_the_clock() -> None:
    clock = Clock()
    identity = verifier(Jwks(), clock, leeway_seconds=0)
    token = RS.sign(exp=NOW + 60)
    assert await identity.subject(token, PROVIDER) == SUBJECT
    clock.now = NOW + 59
    assert await identity.subject(token, PROVIDER) == SUBJECT
    clock.now = NOW + 60
    assert await refusal(identity, token) == "expired"


# --- issuer, audience, subject ---


@pytest.mark.parametrize("claims", [{"iss": "https://evil.example/"}, {"iss": ["https://id.example/"]}])
async def test_another_issuer_is_refused(claims: dict[str, Any]) -> None:
    assert await refusal(verifier(Jwks()), RS.sign(**claims)) == "wrong issuer"


async def test_a_token_without_issuer_is_refused() -> None:
    assert await refusal(verifier(Jwks()), RS.sign(drop=("iss",))) == "wrong issuer"


@pytest.mark.parametrize("aud", ["other-app", ["other-app", "third-app"], []])
async def test_another_audience_is_refused(aud: object) -> None:
    assert await refusal(verifier(Jwks()), RS.sign(aud=aud)) == "wrong audience"


async def test_a_token_without_audience_is_refused() -> None:
    assert await refusal(verifier(Jwks()), RS.sign(drop=("aud",))) == "wrong audience"


async def test_the_issuer_and_audience_are_the_providers() -> None:
    identity = verifier(Jwks())
    other = IdentityProvider(jwks_url=PROVIDER.jwks_url, issuer=PROVIDER.issuer, audience="another-app")
    token = RS.sign()
    assert await identity.subject(token, PROVIDER) == SUBJECT
    assert await refusal(identity, token, other) == "wrong audience"  # remembered per (token, provider)


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({"drop": ("sub",)}, "no subject"),
        ({"sub": ""}, "no subject"),
        ({"sub": 42}, "no subject"),
        ({"sub": "s" * (MAX_SUBJECT_LENGTH + 1)}, "bad subject"),
        ({"sub": "user\nX-Admin: yes"}, "bad subject"),
        ({"sub": "user\u202eevil"}, "bad subject"),
    ],
    ids=["missing", "empty", "number", "too-long", "newline", "bidi-override"],
)
async def test_a_bad_subject_is_refused(claims: dict[str, Any], message: str) -> None:
    assert await refusal(verifier(Jwks()), RS.sign(**claims)) == message


# --- signature and algorithm ---


async def test_a_signature_by_another_key_under_the_same_kid_is_refused() -> None:
    impostor = SigningKey(RS.kid, key_name="impostor")
    assert await refusal(verifier(Jwks()), impostor.sign()) == "bad signature"


async def test_a_tampered_payload_is_refused() -> None:
    header, _, signature = RS.sign().split(".")
    payload = b64(json.dumps({**CLAIMS, "sub": "admin"}).encode())
    assert await refusal(verifier(Jwks()), f"{header}.{payload}.{signature}") == "bad signature"


@pytest.mark.parametrize("alg", ["none", "None", "HS256", "RS384", "PS256", "EdDSA"])
async def test_other_algorithms_are_refused_without_fetching_keys(alg: str) -> None:
    jwks = Jwks()
    token = unsigned({"alg": alg, "typ": "JWT", "kid": RS.kid}, CLAIMS, signature=b"forged")
    assert await refusal(verifier(jwks), token) == "unsupported algorithm"
    assert jwks.fetches == 0


async def test_hs256_signed_with_the_published_public_key_is_refused() -> None:
    # The algorithm-confusion attack: the RSA public key, which anyone can read, used as an HMAC secret.
    public_key = rsa_private_key(RS.kid).public_key()
    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    header = {"alg": "HS256", "typ": "JWT", "kid": RS.kid}
    signing_input = unsigned(header, CLAIMS).rsplit(".", 1)[0]
    token = f"{signing_input}.{b64(hmac.new(pem, signing_input.encode(), hashlib.sha256).digest())}"
    assert await refusal(verifier(Jwks()), token) == "unsupported algorithm"


async def test_a_token_whose_algorithm_differs_from_its_keys_is_refused() -> None:
    wrong = SigningKey(RS.kid, alg="ES256", key_name=ES.kid)  # ES256, naming the RSA key
    assert await refusal(verifier(Jwks()), wrong.sign()) == "unsupported algorithm"


@pytest.mark.parametrize(
    "token",
    [
        "",
        "not-a-jwt",
        "a.b.c",
        "eyJhbGciOiJSUzI1NiJ9.e30",
        unsigned({"alg": "RS256", "kid": 7}, CLAIMS),
        "eyJ" + "A" * 20_000 + ".e30.sig",
    ],
    ids=["empty", "one-part", "not-base64-json", "two-parts", "kid-not-a-string", "huge"],
)
async def test_a_malformed_token_is_refused_without_fetching_keys(token: str) -> None:
    jwks = Jwks()
    assert await refusal(verifier(jwks), token) == "malformed token"
    assert jwks.fetches == 0


async def test_a_huge_token_is_refused_even_when_validly_signed() -> None:
    assert await refusal(verifier(Jwks()), RS.sign(padding="x" * 20_000)) == "malformed token"


async def test_a_payload_that_is_not_json_is_refused() -> None:
    header, _, _ = RS.sign().split(".")
    signing_input = f"{header}.{b64(b'not json')}"
    signature = rsa_private_key(RS.kid).sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    assert await refusal(verifier(Jwks()), f"{signing_input}.{b64(signature)}") == "malformed token"


# --- the keys' cache: rotation, rate limit, single flight, failures ---


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tokens PyJWT is asked to decode, in order."""
    seen: list[str] = []
    real_decode = jwt.decode

    def counting_decode(token: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(token)
        return real_decode(token, *args, **kwargs)

    monkeypatch.setattr(jwt, "decode", counting_decode)
    return seen


async def test_keys_are_fetched_once_and_tokens_remembered(decodes: list[str]) -> None:
    jwks = Jwks()
    identity = verifier(jwks)
    token = RS.sign()
    for _ in range(3):
        assert await identity.subject(token, PROVIDER) == SUBJECT
    assert await identity.subject(ES.sign(), PROVIDER) == SUBJECT
    assert len(decodes) == 2
    assert jwks.fetches == 1


async def test_remembered_tokens_are_bounded(decodes: list[str]) -> None:
    identity = verifier(Jwks(), max_remembered=2)
    first, second, third = RS.sign(jti="1"), RS.sign(jti="2"), RS.sign(jti="3")
    for token in (first, second, third, third, first):  # the third finds the memory full and clears it
        assert await identity.subject(token, PROVIDER) == SUBJECT
    assert decodes == [first, second, third, first]


async def test_a_new_kid_is_fetched_at_once_and_a_removed_one_refused_once_the_set_is_old() -> None:
    jwks, clock = Jwks(keys=[RS.jwk()]), Clock()
    identity = verifier(jwks, clock, min_refetch_seconds=30, keys_max_age_seconds=600)
    old_token = RS.sign(jti="old")
    assert await identity.subject(old_token, PROVIDER) == SUBJECT
    rotated = SigningKey("rs-2")
    jwks.keys = [RS.jwk(), rotated.jwk()]
    clock.now += 31
    assert await identity.subject(rotated.sign(), PROVIDER) == SUBJECT
    assert jwks.fetches == 2
    jwks.keys = [rotated.jwk()]
    clock.now += 599  # the set fetched for the rotation is not yet old: the old kid is still trusted
    assert await identity.subject(RS.sign(jti="still"), PROVIDER) == SUBJECT
    assert jwks.fetches == 2
    clock.now += 1
    assert await refusal(identity, RS.sign(jti="after")) == "unknown signing key"
    assert await refusal(identity, old_token) == "unknown signing key"  # a remembered token is checked again
    assert jwks.fetches == 3


async def test_unknown_kids_cause_at_most_one_refetch_per_interval() -> None:
    jwks, clock = Jwks(), Clock()
    identity = verifier(jwks, clock, min_refetch_seconds=30)
    await identity.subject(RS.sign(), PROVIDER)
    clock.now += 30
    for _ in range(20):
        made_up = SigningKey(secrets.token_hex(4), key_name=RS.kid)
        assert await refusal(identity, made_up.sign()) == "unknown signing key"
        clock.now += 1
    assert jwks.fetches == 2  # the first, and one for the first made-up kid
    clock.now += 10
    await refusal(identity, SigningKey("again", key_name=RS.kid).sign())
    assert jwks.fetches == 3


async def test_concurrent_first_verifications_share_one_fetch() -> None:
    jwks = Jwks()
    identity = verifier(jwks)
    tokens = [RS.sign(jti=str(n)) for n in range(50)]
    subjects = await asyncio.gather(*(identity.subject(token, PROVIDER) for token in tokens))
    assert subjects == [SUBJECT] * 50
    assert jwks.fetches == 1


async def test_a_cancelled_waiter_does_not_cancel_the_shared_fetch() -> None:
    release = asyncio.Event()
    jwks = Jwks()

    async def slow_fetch(url: str) -> bytes:
        await release.wait()
        return await jwks(url)

    identity = IdentityVerifier(slow_fetch, clock=Clock())
    first = asyncio.create_task(identity.subject(RS.sign(jti="1"), PROVIDER))
    second = asyncio.create_task(identity.subject(RS.sign(jti="2"), PROVIDER))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await second == SUBJECT
    assert first.cancelled()
    assert jwks.fetches == 1


async def test_without_keys_a_failed_fetch_is_unavailable_and_retried_once_the_wait_is_over() -> None:
    jwks, clock = Jwks(failing=True), Clock()
    identity = verifier(jwks, clock, min_refetch_seconds=30)
    with pytest.raises(IdentityUnavailable):
        await identity.subject(RS.sign(), PROVIDER)
    jwks.failing = False
    for _ in range(5):  # tokens naming an unreachable provider do not become a stream of fetches
        with pytest.raises(IdentityUnavailable):
            await identity.subject(RS.sign(), PROVIDER)
    assert jwks.fetches == 1
    clock.now += 31
    assert await identity.subject(RS.sign(), PROVIDER) == SUBJECT
    assert jwks.fetches == 2


@pytest.mark.parametrize(
    "body",
    [b"<html>502</html>", b"\xff\xfe", b'{"keys": "none"}', b"[]", json.dumps({"keys": [RS.jwk()] * 101}).encode()],
    ids=["html", "not-utf8", "keys-not-a-list", "not-an-object", "too-many-keys"],
)
async def test_a_bad_key_set_document_is_unavailable(body: bytes) -> None:
    with pytest.raises(IdentityUnavailable):
        await verifier(Jwks(body=body)).subject(RS.sign(), PROVIDER)


async def test_a_failed_refetch_keeps_the_cached_keys(caplog: pytest.LogCaptureFixture) -> None:
    jwks, clock = Jwks(), Clock()
    identity = verifier(jwks, clock, keys_max_age_seconds=600, min_refetch_seconds=30)
    assert await identity.subject(RS.sign(jti="1"), PROVIDER) == SUBJECT
    jwks.failing = True
    clock.now += 600
    token = RS.sign(jti="2")
    with caplog.at_level(logging.WARNING, logger="credgate.identity"):
        assert await identity.subject(token, PROVIDER) == SUBJECT
        assert await identity.subject(RS.sign(jti="3"), PROVIDER) == SUBJECT
    assert jwks.fetches == 2  # the second verification, within min_refetch_seconds, did not ask again
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert token not in caplog.text
    assert SUBJECT not in caplog.text


async def test_each_provider_has_its_own_key_set() -> None:
    jwks = Jwks(keys=[RS.jwk()])
    identity = verifier(jwks)
    other = IdentityProvider(jwks_url="https://other.example/jwks", issuer=PROVIDER.issuer, audience="app-123")
    assert await identity.subject(RS.sign(), PROVIDER) == SUBJECT
    assert await identity.subject(RS.sign(), other) == SUBJECT
    assert jwks.urls == [PROVIDER.jwks_url, other.jwks_url]


# --- the cheap peeks, before any verification ---


def test_signed_tokens_look_like_jwts() -> None:
    assert looks_like_jwt(RS.sign())
    assert looks_like_jwt(ES.sign())


@pytest.mark.parametrize(
    "value", ["", "cg_live_abc123", "eyJ.x", "eyJa.b.c.d", "abc.def.ghi", "eyJa.b c.d", "eyJ" + "A" * 20_000 + ".a.b"]
)
def test_other_values_do_not_look_like_jwts(value: str) -> None:
    assert not looks_like_jwt(value)


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ({"iss": "https://id.example/", "aud": "app"}, ("https://id.example/", ("app",))),
        ({"iss": "https://id.example/", "aud": ["a", "b"]}, ("https://id.example/", ("a", "b"))),
        ({"iss": "https://id.example/"}, ("https://id.example/", ())),
        ({"aud": "app"}, None),
        ({"iss": 5, "aud": "app"}, None),
        ({"iss": "https://id.example/", "aud": [1]}, None),
    ],
)
def test_unverified_issuer_and_audiences(claims: dict[str, Any], expected: object) -> None:
    token = jwt.api_jws.encode(json.dumps(claims).encode(), ec_private_key("peek"), algorithm="ES256")
    assert unverified_issuer_and_audiences(token) == expected


@pytest.mark.parametrize("token", ["", "not-a-jwt", "eyJhbGciOiJSUzI1NiJ9.bm90IGpzb24.c2ln", "a.b.c"])
def test_unverified_issuer_and_audiences_of_a_malformed_token(token: str) -> None:
    assert unverified_issuer_and_audiences(token) is None
