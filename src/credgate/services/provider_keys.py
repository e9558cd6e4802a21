"""Provider keys: sealed under the master key, bound to their project and provider; set, rotate, revoke.

An integration holds a pool of keys, in order. The single-key operations (set, revoke) act on the pool as a
whole as a pool of one would: setting replaces the first key's secret (its id stays), revoking destroys every
key's secret.
"""

import secrets
from datetime import datetime

from credgate.crypto import KeyRing, Secret, secret_binding
from credgate.errors import InvalidInput
from credgate.key_shapes import aws_key_parts, check_key_shape_for, service_account_info
from credgate.limits import MAX_KEY_LENGTH
from credgate.resolved import PoolKey
from credgate.storage.models import Integration, ProviderKey

API_KEY_PURPOSE = "api_key"
_HINT_MIN_LENGTH = 12  # below this, four characters would give away too much of the key
_JSON_WHITESPACE = "\t\n\r"


def clean_api_key(api_key: str, *, auth_method: str) -> str:
    """The key as it will be sent, or InvalidInput naming the field (never the value)."""
    api_key = api_key.strip()
    if not api_key:
        raise InvalidInput("api_key", "must not be empty")
    if len(api_key) > MAX_KEY_LENGTH:
        raise InvalidInput("api_key", f"must be at most {MAX_KEY_LENGTH} characters")
    # A JSON key file is never placed in a header, and its line breaks and indentation are JSON white space.
    allowed = _JSON_WHITESPACE if auth_method == "google_service_account" else ""
    if any(
        (ord(char) < 0x20 and char not in allowed) or ord(char) == 0x7F or 0xD800 <= ord(char) < 0xE000
        for char in api_key
    ):
        raise InvalidInput("api_key", "may not hold control characters, line breaks or unpaired surrogates")
    if auth_method == "basic" and ":" not in api_key:
        raise InvalidInput("api_key", "basic auth needs the key as user:password")
    try:
        check_key_shape_for(auth_method, api_key)
    except ValueError as error:
        raise InvalidInput("api_key", str(error)) from None
    return api_key


def key_hint(api_key: str, *, auth_method: str = "") -> str | None:
    """The end of what identifies the key: for a key with parts, of its public id (Google's private_key_id, AWS's
    access key id), which its console shows too, never of the private part; else of the key itself."""
    try:
        if auth_method == "google_service_account":
            return "…" + str(service_account_info(api_key)["private_key_id"])[-4:]
        if auth_method == "aws_sigv4":
            return "…" + aws_key_parts(api_key)[0][-4:]
    except ValueError:
        return None
    return "…" + api_key[-4:] if len(api_key) >= _HINT_MIN_LENGTH else None


def _binding(integration: Integration) -> bytes:
    return secret_binding(project_id=integration.project_id, provider=integration.provider, purpose=API_KEY_PURPOSE)


def new_key_id() -> str:
    return "key_" + secrets.token_hex(12)


def seal_provider_key(keyring: KeyRing, integration: Integration, api_key: str, *, now: datetime) -> None:
    """Store `api_key` as the pool's first key, sealed; replaces (rotates) its secret, or starts the pool. The
    key is back in service: a new secret is the admin's answer to a refusal."""
    key = integration.key
    if key is None:
        key = ProviderKey(id=new_key_id(), position=0, created_at=now, updated_at=now)
        integration.keys.append(key)
    _seal_into(keyring, integration, key, api_key, now=now)


def add_pool_key(keyring: KeyRing, integration: Integration, api_key: str, *, label: str, now: datetime) -> ProviderKey:
    """Add `api_key` at the end of the pool."""
    position = max((key.position for key in integration.keys), default=-1) + 1
    key = ProviderKey(id=new_key_id(), label=label, position=position, created_at=now, updated_at=now)
    integration.keys.append(key)
    _seal_into(keyring, integration, key, api_key, now=now)
    return key


def _seal_into(keyring: KeyRing, integration: Integration, key: ProviderKey, api_key: str, *, now: datetime) -> None:
    key.ciphertext = keyring.seal(api_key.encode(), aad=_binding(integration))
    key.master_key_id = keyring.primary_key_id
    key.hint = key_hint(api_key, auth_method=integration.auth["method"])
    key.failed_at = key.failure = None
    key.updated_at = key.sealed_at = now


def destroy_provider_key(integration: Integration, *, now: datetime) -> None:
    """Revoke every key of the pool: the ciphertexts are overwritten, so nothing can bring a key back."""
    for key in integration.keys:
        key.ciphertext = None
        key.master_key_id = None
        key.hint = None
        key.updated_at = now


def usable_keys(keyring: KeyRing, integration: Integration) -> tuple[PoolKey, ...]:
    """The pool's keys in service, in order, opened: not revoked, not disabled, not refused by the provider."""
    binding = _binding(integration)
    return tuple(
        PoolKey(key.id, Secret(keyring.open(key.ciphertext, aad=binding).decode()))
        for key in integration.keys
        if key.ciphertext is not None and not key.disabled and key.failed_at is None
    )


def open_pool_key(keyring: KeyRing, integration: Integration, key: ProviderKey) -> Secret | None:
    """One key of the pool, opened whatever its state; None once revoked."""
    if key.ciphertext is None:
        return None
    return Secret(keyring.open(key.ciphertext, aad=_binding(integration)).decode())


def open_provider_key(keyring: KeyRing, integration: Integration) -> Secret | None:
    """The first key in service (the single-key view of the pool)."""
    usable = usable_keys(keyring, integration)
    return usable[0].secret if usable else None


def reseal(keyring: KeyRing, integration: Integration, ciphertext: bytes) -> bytes:
    """The same key sealed under the ring's current primary master key (for master-key rotation)."""
    binding = _binding(integration)
    return keyring.seal(keyring.open(ciphertext, aad=binding), aad=binding)
