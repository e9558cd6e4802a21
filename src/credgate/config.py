"""Settings, read from `CREDGATE_*` environment variables; built only by the CLI or the app factory."""

import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

DATABASE_FILE_NAME = "credgate.db"
MASTER_KEY_FILE_NAME = "master.key"
MAX_WORKERS = 256
ENV_PREFIX = "CREDGATE_"


def _secure_transport(url: str) -> bool:
    """https, or plain http to a provider on this very machine (OAuth's rule for loopback, RFC 8252 §7.3)."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return bool(parts.hostname)
    return parts.scheme == "http" and parts.hostname in ("localhost", "127.0.0.1", "::1")


class Settings(BaseModel):
    """Every setting of the gateway (README, Configuration): those given, and `CREDGATE_<NAME>` for the others.

    A model that reads its variables itself: pydantic-settings would read them the same way, and costs every
    worker 1.4 MB of memory for its other sources (.env, TOML, secret stores, a command line), unused here."""

    model_config = ConfigDict(validate_default=True)

    data_dir: Path = Path("./credgate-data")
    database_url: str | None = None
    master_key: SecretStr | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # A second listener for the admin API, the panel and /metrics; the main one then serves the proxy and health only.
    admin_host: str | None = None
    admin_port: int | None = Field(default=None, ge=1, le=65535)
    # `credgate serve` processes sharing the listening socket: about one per core (README, Running several workers).
    workers: int = Field(default=1, ge=1, le=MAX_WORKERS)
    # Each worker on a core of its own, the CPUs this process may use taken in turn: for a machine (or cpuset) the
    # gateway has to itself (README, Several workers).
    pin_workers: bool = False
    allow_private_upstreams: bool = False
    # The ports a public upstream (base URL, OAuth token URL) may be reached on, comma-separated. Hosts listed in an
    # integration's private_networks, and every host while CREDGATE_ALLOW_PRIVATE_UPSTREAMS is on, may use any.
    upstream_ports: str = "443"
    max_request_bytes: int = Field(default=32 * 1024 * 1024, ge=1)
    # The request line and headers, counted as they arrive: more gets 431 before anything else is done.
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=1024 * 1024)
    # How long a client may take to send the request line and headers (then 408, connection closed).
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=3600)
    # How long a client may pause while sending its request body before it gets 408.
    client_body_timeout_seconds: float = Field(default=60.0, gt=0)
    # How long a response may wait for a client to make room for more of it (one that stopped reading) before the
    # connection is closed; as nginx's send_timeout.
    send_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    # How often an instance looks for changes made by other instances or the CLI (at most a second: README).
    change_poll_seconds: float = Field(default=0.5, gt=0, le=1)
    # On SIGTERM: stop accepting, let requests and streams in flight finish for at most this long, exit 0.
    drain_seconds: float = Field(default=30.0, ge=0, le=3600)
    # Shared by every worker and instance: rate limits counted once, change notices (README, Many instances).
    redis_url: SecretStr | None = None
    # While the database does not answer, cached access is served for at most this long (0: never), then 503.
    stale_seconds: float = Field(default=30.0, ge=0, le=86400)
    log_level: str = "info"
    # `text`, or `json`: one object per line, the request id on every line about a request (README, Logs).
    log_format: Literal["text", "json"] = "text"
    # How often each process looks for events no request announces: budget thresholds, key ages, token expiry.
    event_scan_seconds: float = Field(default=15.0, gt=0, le=3600)
    # How long the request log keeps a proxied request (bodies are never kept).
    request_log_days: int = Field(default=31, ge=1)  # a month at least: budgets start from it
    # Single sign-on to the panel through an OpenID Connect provider (README, Single sign-on): its issuer URL
    # (discovery at /.well-known/openid-configuration), this gateway's client id, and its secret unless public.
    oidc_issuer: str | None = None
    oidc_client_id: str | None = None
    oidc_client_secret: SecretStr | None = None
    # What a first sign-in of someone the panel has no user for gives: nothing (an owner adds them first) or
    # read-only access to every project.
    oidc_new_users: Literal["refused", "viewer"] = "refused"
    # The email domains, comma-separated, whose addresses `viewer` admits: a public provider knows everyone.
    oidc_email_domains: str = ""
    # The button's words: "Sign in with <name>".
    oidc_name: str = Field(default="single sign-on", min_length=1, max_length=64)

    @model_validator(mode="before")
    @classmethod
    def _with_environment(cls, given: Any) -> Any:
        if not isinstance(given, dict):
            return given
        variables = {
            name[len(ENV_PREFIX) :].lower(): value
            for name, value in os.environ.items()
            if name.upper().startswith(ENV_PREFIX)  # without regard to case, as pydantic-settings
        }
        return {name: value for name, value in variables.items() if name in cls.model_fields} | given

    @model_validator(mode="after")
    def _admin_listener_has_a_port(self) -> "Settings":
        if self.admin_host is not None and self.admin_port is None:
            raise ValueError("CREDGATE_ADMIN_HOST is set without CREDGATE_ADMIN_PORT: set the admin listener's port")
        return self

    @model_validator(mode="after")
    def _oidc_is_whole(self) -> "Settings":
        if (self.oidc_issuer is None) != (self.oidc_client_id is None):
            raise ValueError("single sign-on needs both CREDGATE_OIDC_ISSUER and CREDGATE_OIDC_CLIENT_ID")
        if self.oidc_issuer is not None and not _secure_transport(self.oidc_issuer):
            raise ValueError("CREDGATE_OIDC_ISSUER must be an https:// URL (http:// only on this machine's loopback)")
        if self.oidc_new_users == "viewer" and not self.oidc_email_domain_set:
            raise ValueError(
                "CREDGATE_OIDC_NEW_USERS=viewer needs CREDGATE_OIDC_EMAIL_DOMAINS: the domains whose people may "
                "come in, for a public identity provider knows everyone"
            )
        return self

    @field_validator("upstream_ports")
    @classmethod
    def _ports_are_ports(cls, value: str) -> str:
        for part in value.split(","):
            if not (part.strip().isdigit() and 1 <= int(part) <= 65535):
                raise ValueError(f"{part.strip()!r} is not a port: give whole numbers from 1 to 65535, comma-separated")
        return value

    @property
    def upstream_port_set(self) -> frozenset[int]:
        return frozenset(int(part) for part in self.upstream_ports.split(","))

    @property
    def oidc_email_domain_set(self) -> frozenset[str]:
        return frozenset(part.strip().lower() for part in self.oidc_email_domains.split(",") if part.strip())

    @property
    def admin_listener(self) -> tuple[str, int] | None:
        """Where the admin API, panel and metrics listen when they have a listener of their own (loopback unless
        CREDGATE_ADMIN_HOST says otherwise)."""
        if self.admin_port is None:
            return None
        return (self.admin_host or "127.0.0.1", self.admin_port)

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{self.data_dir / DATABASE_FILE_NAME}"

    @property
    def master_key_file(self) -> Path:
        return self.data_dir / MASTER_KEY_FILE_NAME
