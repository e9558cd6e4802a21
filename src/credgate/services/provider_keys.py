"""Provider keys: sealed under the master key, bound to their project and provider; set, rotate, revoke."""

from datetime import datetime

from credgate.crypto import KeyRing, Secret, secret_binding
from credgate.errors import InvalidInput
from credgate.key_shapes import aws_key_parts, check_key_shape_for, service_account_info
from credgate.limits import MAX_KEY_LENGTH
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


def seal_provider_key(keyring: KeyRing, integration: Integration, api_key: str, *, now: datetime) -> None:
    """Store `api_key` on the integration, sealed; replaces (rotates) any earlier key."""
    ciphertext = keyring.seal(api_key.encode(), aad=_binding(integration))
    hint = key_hint(api_key, auth_method=integration.auth["method"])
    fields = {"ciphertext": ciphertext, "master_key_id": keyring.primary_key_id, "hint": hint}
    if integration.key is None:
        integration.key = ProviderKey(updated_at=now, **fields)
    else:
        for name, value in fields.items():
            setattr(integration.key, name, value)
        integration.key.updated_at = now


def destroy_provider_key(integration: Integration, *, now: datetime) -> None:
    """Revoke: the ciphertext is overwritten, so nothing can bring the key back."""
    if integration.key is not None:
        integration.key.ciphertext = None
        integration.key.master_key_id = None
        integration.key.hint = None
        integration.key.updated_at = now


def open_provider_key(keyring: KeyRing, integration: Integration) -> Secret | None:
    if integration.key is None or integration.key.ciphertext is None:
        return None
    return Secret(keyring.open(integration.key.ciphertext, aad=_binding(integration)).decode())


def reseal(keyring: KeyRing, integration: Integration, ciphertext: bytes) -> bytes:
    """The same key sealed under the ring's current primary master key (for master-key rotation)."""
    binding = _binding(integration)
    return keyring.seal(keyring.open(ciphertext, aad=binding), aad=binding)
