"""What an integration is made of, validated: provider names, auth methods, endpoints, headers, base URLs.

Pure definitions shared by the catalogue, the services, the admin API and the proxy. Validation messages
name the problem, never echo the value (a misplaced key must not come back in an error).
"""

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from credgate.limits import MAX_ALLOWED_ORIGINS, MAX_PROVIDER_NAME_LENGTH, MAX_URL_LENGTH
from credgate.paths import MalformedPath, parse_path

PROVIDER_NAME = re.compile(rf"[a-z0-9][a-z0-9_-]{{0,{MAX_PROVIDER_NAME_LENGTH - 1}}}")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_TOKEN_CHARS = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token: a header name
# Hop-by-hop headers (RFC 9110 section 7.6.1): they concern one connection and are never relayed.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Headers a configuration may not set or place a key in: the transport owns them.
RESERVED_HEADERS = HOP_BY_HOP | {"host", "content-length"}


def check_provider_name(name: str) -> str:
    if not PROVIDER_NAME.fullmatch(name):
        raise ValueError(
            "must be lowercase letters, digits, '-' or '_', starting with a letter or digit, "
            f"at most {MAX_PROVIDER_NAME_LENGTH}"
        )
    return name


def check_header_name(name: str) -> str:
    if not _TOKEN_CHARS.fullmatch(name):
        raise ValueError("is not a valid HTTP header name")
    return name


def _check_credential_header(name: str) -> str:
    if name.lower() in RESERVED_HEADERS:
        raise ValueError(f"header {name} is set by the transport and cannot carry the key")
    return name


def _check_header_value(value: str) -> str:
    # RFC 9110 field values: visible characters, spaces and tabs; no line break, NUL or other control.
    if any((ord(char) < 0x20 and char != "\t") or ord(char) == 0x7F or 0xD800 <= ord(char) < 0xE000 for char in value):
        raise ValueError("a header value may not hold line breaks, NUL or other control characters")
    return value


def _check_headers(headers: dict[str, str]) -> dict[str, str]:
    for name, value in headers.items():
        check_header_name(name)
        if name.lower() in RESERVED_HEADERS:
            raise ValueError(f"header {name} is set by the transport and cannot be configured")
        _check_header_value(value)
    return headers


def check_base_url(url: str) -> str:
    """An absolute http(s) URL without credentials, query or fragment; returned without a trailing slash."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError("is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("must start with http:// or https://")
    if not parts.hostname:
        raise ValueError("must name a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("may not hold credentials; set the API key instead")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ValueError("may not hold a query or fragment; use the integration's query parameters")
    if port == 0:
        raise ValueError("port 0 is not a valid port")
    if any(char.isspace() or not char.isprintable() for char in url):
        raise ValueError("may not contain white space or control characters")
    return url.rstrip("/")


def normalize_origin(origin: str) -> str:
    """A web origin as browsers send it in `Origin`: `scheme://host[:port]`, lowercase, the default port left out."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        raise ValueError("is not a valid origin") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be scheme://host[:port], with http or https")
    if parts.username is not None or parts.password is not None or parts.path not in ("", "/"):
        raise ValueError("must be scheme://host[:port] alone, with no path")
    if parts.query or parts.fragment or origin.strip().endswith(("?", "#")) or port == 0:
        raise ValueError("must be scheme://host[:port] alone, with no path")
    host = parts.hostname
    if not host.isascii():  # browsers send an internationalised name in its ASCII (punycode) form
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError("is not a valid origin") from None
    host = f"[{host}]" if ":" in host else host
    default_port = 443 if parts.scheme == "https" else 80
    return f"{parts.scheme}://{host}" + ("" if port in (None, default_port) else f":{port}")


def _check_endpoint_path(path: str) -> str:
    path = path.strip("/")
    if not path:
        raise ValueError("must name at least one segment")
    segments = path.split("/")
    for index, segment in enumerate(segments):
        if not segment:
            raise ValueError("may not hold empty segments")
        if segment in (".", ".."):
            raise ValueError("may not hold '.' or '..' segments")
        if segment == "**" and index != len(segments) - 1:
            raise ValueError("'**' may only be the last segment")
        if "*" in segment and segment not in ("*", "**"):
            raise ValueError("a wildcard must be a whole segment: '*' or '**'")
        if any(char in segment for char in "?#\\") or any(char.isspace() for char in segment):
            raise ValueError("may not hold '?', '#', '\\' or white space")
    return "/".join(segments)


ProviderName = Annotated[str, AfterValidator(check_provider_name)]
# How an integration's pool of keys is used: in order, the next when one is out, or taking turns.
KeyStrategy = Literal["failover", "spread"]
HeaderName = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(check_header_name)]
HeaderMap = Annotated[dict[str, str], AfterValidator(_check_headers)]
QueryMap = Annotated[dict[Annotated[str, Field(min_length=1, max_length=200)], str], Field(max_length=64)]
BaseUrl = Annotated[str, Field(max_length=MAX_URL_LENGTH), AfterValidator(check_base_url)]
Origin = Annotated[str, Field(max_length=MAX_URL_LENGTH), AfterValidator(normalize_origin)]
Origins = Annotated[list[Origin], Field(max_length=MAX_ALLOWED_ORIGINS)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Endpoint(_Spec):
    """An allowed upstream call: a method (or `*`) and a path pattern (`*` one segment, `**` the rest)."""

    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "*"]
    path: Annotated[str, Field(max_length=1024), AfterValidator(_check_endpoint_path)]


def _check_call_path(path: str) -> str:
    path = _check_endpoint_path(path)
    if "*" in path.split("/"):
        raise ValueError("may hold no wildcard: it names one path")
    try:
        parse_path(path)  # as the proxy reads a client's: no encoded dot segment or separator
    except MalformedPath as error:
        raise ValueError(f"is not a path the proxy would send ({error})") from None
    return path


class VerifyCall(Endpoint):
    """An admin's call that tells whether the provider takes a key: one path under the base URL, asked with GET
    (or POST, for an API whose cheapest check is one), with no body. It costs the provider a request, nothing more."""

    method: Literal["GET", "POST"]  # narrower than an endpoint's
    path: Annotated[str, Field(max_length=1024), AfterValidator(_check_call_path)]

    @classmethod
    def parse(cls, text: str) -> "VerifyCall":
        """From "METHOD path" (`GET models`), as the CLI and the panel take it; ValidationError when it is not one."""
        method, _, path = text.strip().partition(" ")
        return cls.model_validate({"method": method.upper(), "path": path.strip()})

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


class BearerAuth(_Spec):
    """`Authorization: Bearer <key>`."""

    method: Literal["bearer"] = "bearer"


class HeaderAuth(_Spec):
    """The key in a header of its own, after an optional prefix (`x-api-key: <key>`, `Authorization: Token <key>`)."""

    method: Literal["header"]
    name: Annotated[HeaderName, AfterValidator(_check_credential_header)]
    prefix: Annotated[str, Field(max_length=64), AfterValidator(_check_header_value)] = ""


class QueryAuth(_Spec):
    """The key as a query parameter."""

    method: Literal["query"]
    name: Annotated[str, Field(min_length=1, max_length=200)]


class BasicAuth(_Spec):
    """HTTP Basic; the key is `user:password`."""

    method: Literal["basic"]


TokenUrl = Annotated[str, Field(max_length=MAX_URL_LENGTH), AfterValidator(check_base_url)]
OAuthText = Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_check_header_value)]


class OAuth2ClientCredentialsAuth(_Spec):
    """OAuth 2.0 client credentials (RFC 6749 section 4.4); the key is the client secret. credgate obtains the
    access token from `token_url`, caches it until shortly before it expires, and sends it as a bearer token."""

    method: Literal["oauth2_client_credentials"]
    token_url: TokenUrl
    client_id: OAuthText
    scope: OAuthText | None = None
    audience: OAuthText | None = None
    client_auth: Literal["basic", "post"] = "basic"  # how the client secret goes to the token endpoint


class OAuth2RefreshTokenAuth(_Spec):
    """OAuth 2.0 refresh-token grant (RFC 6749 section 6); the key is the refresh token, replaced (sealed
    again) whenever the token endpoint returns a new one."""

    method: Literal["oauth2_refresh_token"]
    token_url: TokenUrl
    client_id: OAuthText
    scope: OAuthText | None = None


class GoogleServiceAccountAuth(_Spec):
    """A Google service account (Vertex AI and other Google Cloud APIs); the key is the account's JSON key file.
    credgate signs a JWT assertion with its private key, trades it at `token_url` for an access token (the JWT
    bearer grant, RFC 7523), caches that like client credentials and sends it as a bearer token. The JSON's
    own `token_uri` is not used: the endpoint credgate calls is the one set here, checked like any upstream."""

    method: Literal["google_service_account"]
    token_url: TokenUrl = "https://oauth2.googleapis.com/token"  # noqa: S105 - a public endpoint
    scope: OAuthText = "https://www.googleapis.com/auth/cloud-platform"


AwsName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$")]


class AwsSigV4Auth(_Spec):
    """AWS Signature Version 4 (Bedrock and other AWS APIs); the key is `ACCESS_KEY_ID:SECRET_ACCESS_KEY`, or
    `ACCESS_KEY_ID:SECRET_ACCESS_KEY:SESSION_TOKEN` for temporary credentials. Every request is signed for
    `service` in `region` over the exact bytes forwarded (the body is read whole first); the secret access
    key itself never leaves credgate. Without a region, the region named in the base URL's host is used
    (`bedrock-runtime.eu-west-1.amazonaws.com`), so moving an integration to another region is one change."""

    method: Literal["aws_sigv4"]
    region: AwsName | None = None
    service: AwsName = "bedrock"


AuthSpec = Annotated[
    BearerAuth
    | HeaderAuth
    | QueryAuth
    | BasicAuth
    | OAuth2ClientCredentialsAuth
    | OAuth2RefreshTokenAuth
    | GoogleServiceAccountAuth
    | AwsSigV4Auth,
    Field(discriminator="method"),
]
# Methods whose credential on the wire is an access token credgate obtains (proxy/oauth.py) from the stored key.
OAUTH2_METHODS = frozenset({"oauth2_client_credentials", "oauth2_refresh_token", "google_service_account"})


class IdentityProviderSpec(_Spec):
    """An identity provider a project trusts for its end users: where its signing keys are published (JWKS),
    and the issuer (`iss`) and audience (`aud`) its tokens must name."""

    jwks_url: BaseUrl
    issuer: Annotated[str, Field(min_length=1, max_length=500)]
    audience: Annotated[str, Field(min_length=1, max_length=500)]
