"""KeyRing: AES-256-GCM under the master key(s); token generation and hashing.

A ciphertext is `version (1) | key id (4) | nonce (12) | ciphertext+tag`. The key id says which master key
sealed it, so a ring holding old and new keys can read both while `credgate master-key rotate` runs. The
associated data binds a secret to its row: a ciphertext copied to another project or provider fails.
"""

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MASTER_KEY_BYTES = 32
TOKEN_BYTES = 32  # 256 bits of entropy per token
_VERSION = b"\x01"
_KEY_ID_BYTES = 4
_NONCE_BYTES = 12
_HEADER_BYTES = len(_VERSION) + _KEY_ID_BYTES + _NONCE_BYTES
_TAG_REFRESH_SECONDS = 10


class DecryptionError(Exception):
    """A ciphertext could not be opened: unknown key, wrong key or wrong binding. Never holds the secret."""


class MasterKeyFormatError(ValueError):
    """A master key is not 32 bytes of base64url."""


def new_master_key() -> bytes:
    return secrets.token_bytes(MASTER_KEY_BYTES)


def encode_master_key(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode().rstrip("=")


def decode_master_key(text: str) -> bytes:
    text = text.strip()
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except ValueError:
        raise MasterKeyFormatError("a master key must be base64url") from None
    if len(key) != MASTER_KEY_BYTES:
        raise MasterKeyFormatError(f"a master key must be {MASTER_KEY_BYTES} bytes, base64url-encoded")
    return key


def master_key_id(key: bytes) -> bytes:
    # A one-way tag of the key: it names the key in ciphertexts without revealing anything about it.
    return hmac.digest(key, b"credgate master key id", "sha256")[:_KEY_ID_BYTES]


def ciphertext_key_id(blob: bytes) -> str:
    return blob[len(_VERSION) : len(_VERSION) + _KEY_ID_BYTES].hex()


class KeyRing:
    """The master keys in use: the first seals, all of them open.

    `reload`, when given, re-reads the keys from their source: before sealing (so every instance seals under
    the newest key at once) and when a ciphertext names a key this ring does not hold yet.
    """

    def __init__(self, keys: Sequence[bytes], *, reload: Callable[[], Sequence[bytes]] | None = None) -> None:
        self._reload = reload
        self._set(keys)

    def _set(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise MasterKeyFormatError("the key ring needs at least one master key")
        self._primary_id = master_key_id(keys[0])
        self._ciphers = {master_key_id(key): AESGCM(key) for key in keys}
        self._keys = {master_key_id(key): key for key in keys}
        self._mac_keys: dict[tuple[bytes, bytes], bytes] = {}
        self._refreshed_at = time.monotonic()

    def refresh(self) -> None:
        if self._reload is not None:
            self._set(self._reload())

    @property
    def primary_key_id(self) -> str:
        return self._primary_id.hex()

    @property
    def key_ids(self) -> list[str]:
        return [key_id.hex() for key_id in self._ciphers]

    def seal(self, plaintext: bytes, *, aad: bytes) -> bytes:
        self.refresh()
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._ciphers[self._primary_id].encrypt(nonce, plaintext, aad)
        return _VERSION + self._primary_id + nonce + sealed

    def open(self, blob: bytes, *, aad: bytes) -> bytes:
        if len(blob) <= _HEADER_BYTES or blob[:1] != _VERSION:
            raise DecryptionError("not a credgate ciphertext")
        key_id = blob[1 : 1 + _KEY_ID_BYTES]
        if key_id not in self._ciphers:
            self.refresh()
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise DecryptionError(f"sealed under master key {key_id.hex()}, which the key ring does not hold")
        nonce = blob[1 + _KEY_ID_BYTES : _HEADER_BYTES]
        try:
            return cipher.decrypt(nonce, blob[_HEADER_BYTES:], aad)
        except InvalidTag:
            raise DecryptionError("the ciphertext does not open under its key and binding") from None

    def _refresh_within(self, seconds: float) -> None:
        now = time.monotonic()
        if now - self._refreshed_at > seconds:
            self._refreshed_at = now
            self.refresh()

    def holds_key_of(self, tag: bytes) -> bool:
        """Whether the master key that made `tag` is still in the ring. The keys are re-read now and then, so that
        a key a rotation dropped stops counting in every process soon after, for a tag checked earlier too."""
        self._refresh_within(_TAG_REFRESH_SECONDS)
        return tag[:_KEY_ID_BYTES] in self._keys

    def _mac_key(self, key_id: bytes, purpose: bytes) -> bytes:
        # One key per purpose, derived from the master key: a tag made for one use is worthless for another.
        found = self._mac_keys.get((key_id, purpose))
        if found is None:
            derived = hmac.digest(self._keys[key_id], b"credgate/v1 mac " + purpose, "sha256")
            found = self._mac_keys[(key_id, purpose)] = derived
        return found

    def tag(self, message: bytes, *, purpose: bytes) -> bytes:
        """`message`'s tag under the primary master key: key id (4) | HMAC-SHA256 (32). Every instance sharing
        the master key can check it; nothing is stored. The keys are re-read now and then (not per tag: tags
        are made by the thousand), so that after a rotation every process tags under the new key soon."""
        self._refresh_within(_TAG_REFRESH_SECONDS)
        return self._primary_id + hmac.digest(self._mac_key(self._primary_id, purpose), message, "sha256")

    def check_tag(self, message: bytes, tag: bytes, *, purpose: bytes) -> bool:
        """Whether `tag` is `message`'s under any master key of the ring (an older one too, during a rotation)."""
        key_id = tag[:_KEY_ID_BYTES]
        if not self.holds_key_of(tag):
            self._refresh_within(1)  # made by a process that already holds a newer key (made-up ids: once a second)
            if key_id not in self._keys:
                return False
        expected = hmac.digest(self._mac_key(key_id, purpose), message, "sha256")
        return hmac.compare_digest(tag[_KEY_ID_BYTES:], expected)


def secret_binding(*, project_id: str, provider: str, purpose: str) -> bytes:
    """The associated data that ties a stored secret to its project, provider and purpose."""
    return b"\x00".join((b"credgate/v1", project_id.encode(), provider.encode(), purpose.encode()))


def generate_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(TOKEN_BYTES)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Secret:
    """A plaintext credential in memory; its repr and str never show the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(self._value)
