"""The shape a stored key must have for auth methods that need more than an opaque string.

Pure: no I/O. Every message names the expected shape and never echoes the key, or any part of it, since a
misplaced secret must not come back in an error.
"""

import json
import re

from credgate.specs import AuthSpec

_SERVICE_ACCOUNT_SHAPE = (
    "must be the service account's JSON key file as Google downloads it: a JSON object with "
    "client_email, private_key (PEM) and private_key_id"
)
_AWS_SHAPE = "must be ACCESS_KEY_ID:SECRET_ACCESS_KEY or ACCESS_KEY_ID:SECRET_ACCESS_KEY:SESSION_TOKEN"
# What the key of each method with a shape must be, as the panel says it beside the key field.
KEY_SHAPES = {
    "google_service_account": "The key " + _SERVICE_ACCOUNT_SHAPE + ": paste the whole file.",
    "aws_sigv4": "The key " + _AWS_SHAPE + ".",
}
_PEM_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.+-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL)
_SERVICE_ACCOUNT_FIELDS = ("client_email", "private_key", "private_key_id")


def service_account_info(key: str) -> dict[str, object]:
    """The parsed JSON key file, or ValueError naming the expected shape."""
    try:
        info = json.loads(key)
    except ValueError:
        raise ValueError(_SERVICE_ACCOUNT_SHAPE + " (this is not valid JSON)") from None
    if not isinstance(info, dict):
        raise ValueError(_SERVICE_ACCOUNT_SHAPE)
    for field in _SERVICE_ACCOUNT_FIELDS:
        value = info.get(field)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{_SERVICE_ACCOUNT_SHAPE} ({field} is missing or not a string)")
    if not _PEM_PRIVATE_KEY.search(str(info["private_key"])):
        raise ValueError(f"{_SERVICE_ACCOUNT_SHAPE} (private_key is not a PEM private key)")
    return info


def aws_key_parts(key: str) -> tuple[str, str, str | None]:
    """(access key id, secret access key, session token or None), or ValueError naming the expected shape."""
    parts = key.split(":")
    if len(parts) not in (2, 3) or any(not part or any(char.isspace() for char in part) for part in parts):
        raise ValueError(_AWS_SHAPE + ", each part non-empty and without white space")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


def check_key_shape_for(method: str, key: str) -> None:
    """ValueError when `key` cannot work with the auth method named `method`; other methods take any key."""
    if method == "google_service_account":
        service_account_info(key)
    elif method == "aws_sigv4":
        aws_key_parts(key)


def check_key_shape(auth: AuthSpec, key: str) -> None:
    """ValueError when `key` cannot work with `auth`; methods whose key is an opaque string take any key."""
    check_key_shape_for(auth.method, key)
