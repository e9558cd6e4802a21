"""The authentication fields of Custom Configure and of an integration's settings: the methods offered, which
fields each takes, the form read into an AuthSpec, and how the key will be sent, as the page previews it.

Every field is in the page whatever the method; panel.css shows only the chosen method's (no script needed), and
the form reads only those, so a value left in another method's field is ignored."""

from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import FormData

from credgate.admin_ui.base import field
from credgate.admin_ui.messages import auth_errors
from credgate.specs import AuthSpec

METHODS = {
    "bearer": "Authorization: Bearer <key>",
    "header": "A header of its own",
    "query": "A query parameter",
    "basic": "HTTP Basic (key is user:password)",
    "oauth2_client_credentials": "OAuth 2.0 client credentials (key is the client secret)",
    "oauth2_refresh_token": "OAuth 2.0 refresh token (key is the refresh token)",
    "google_service_account": "Google service account (key is its JSON key file)",
    "aws_sigv4": "AWS Signature V4 (key is ACCESS_KEY_ID:SECRET_ACCESS_KEY)",
}
CLIENT_AUTH = {"basic": "HTTP Basic (client ID and secret in the header)", "post": "In the request body"}
FIELDS = ("auth_name", "auth_prefix", "token_url", "client_id", "scope", "audience", "client_auth", "region", "service")
_OAUTH2 = ("oauth2_client_credentials", "oauth2_refresh_token")
_NO_KEY = "<key>"

_auth: TypeAdapter[AuthSpec] = TypeAdapter(AuthSpec)


def word_prefix(prefix: str) -> str:
    """The prefix as it goes before the key: one ending in a letter or digit is a word (`Bearer`, `Token`) and
    gets the space that must follow it; one ending in a symbol (`key=`) or a space is kept as typed."""
    prefix = prefix.lstrip()
    return f"{prefix} " if prefix[-1:].isalnum() else prefix


def values_from(form: FormData) -> dict[str, str]:
    """The method and its fields as posted, the prefix as it will be stored (`Bearer` → `Bearer `)."""
    values = {name: field(form, name) for name in ("auth_method", *FIELDS)}
    values["auth_method"] = values["auth_method"] or "bearer"
    values["auth_prefix"] = word_prefix(str(form.get("auth_prefix") or ""))
    return values


def values_of(auth: Mapping[str, Any]) -> dict[str, str]:
    """A stored auth spec as the form's values."""
    values = {name: str(auth.get(name.removeprefix("auth_")) or "") for name in FIELDS}
    return values | {"auth_method": str(auth["method"]), "client_auth": str(auth.get("client_auth") or "basic")}


def spec_from(values: Mapping[str, str]) -> dict[str, Any]:
    """The auth spec the chosen method's fields make; the other methods' fields are left out."""
    method = values["auth_method"]

    def given(*names: str) -> dict[str, str]:
        return {name: values[name] for name in names if values.get(name)}

    auth: dict[str, Any] = {"method": method}
    if method in ("header", "query"):
        auth["name"] = values.get("auth_name", "")
    if method == "header":
        auth["prefix"] = values.get("auth_prefix", "")
    if method in _OAUTH2:
        auth |= {"token_url": values.get("token_url", ""), "client_id": values.get("client_id", "")} | given("scope")
    if method == "oauth2_client_credentials":
        auth |= given("audience", "client_auth")
    if method == "google_service_account":
        auth |= given("token_url", "scope")
    if method == "aws_sigv4":
        auth |= given("region", "service")
    return auth


def read_auth(values: Mapping[str, str]) -> tuple[AuthSpec | None, dict[str, str]]:
    """The validated spec, or the problems next to their fields."""
    try:
        return _auth.validate_python(spec_from(values)), {}
    except ValidationError as error:
        return None, auth_errors(error)


def same_auth(stored: Mapping[str, Any], chosen: AuthSpec) -> bool:
    try:
        return _auth.validate_python(dict(stored)) == chosen
    except ValidationError:
        return False


def previews(values: Mapping[str, str], hint: str | None = None) -> dict[str, str]:
    """How each method sends the key, with the form's name and prefix and the key's hint (`…1234`); the page shows
    the chosen method's, and static/auth_form.js updates the first three as the fields are typed."""
    key = hint or _NO_KEY
    name = values.get("auth_name") or "<name>"
    token_url = values.get("token_url") or "the token URL"
    return {
        "bearer": f"Authorization: Bearer {key}",
        "header": f"{name}: {values.get('auth_prefix', '')}{key}",
        "query": f"?{name}={key}",
        "basic": "Authorization: Basic <user:password, base64>",
        "oauth2_client_credentials": f"Authorization: Bearer <access token from {token_url}>",
        "oauth2_refresh_token": f"Authorization: Bearer <access token from {token_url}>",
        "google_service_account": "Authorization: Bearer <access token from Google's token URL>",
        "aws_sigv4": "Authorization: AWS4-HMAC-SHA256 <each request signed with the key>",
    }
