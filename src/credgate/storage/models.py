"""The ORM models. A row is never an API schema: secrets live only as ciphertext, in `ProviderKey` and, for a few
minutes, in the panel state of an `AdminSession`."""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from credgate.limits import (
    MAX_ACTOR_LENGTH,
    MAX_KEY_LABEL_LENGTH,
    MAX_NAME_LENGTH,
    MAX_PROVIDER_NAME_LENGTH,
    MAX_URL_LENGTH,
)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on every backend (SQLite keeps no zone, so it is restored on read)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are not stored")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def bind_processor(self, dialect: Dialect) -> Callable[[datetime | None], Any] | None:
        if dialect.name == "sqlite":
            return _sqlite_text
        return super().bind_processor(dialect)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _sqlite_text(value: datetime | None) -> str | None:
    """The text SQLite's DATETIME stores for a moment (naive UTC, microseconds always written), as process_bind_param
    then SQLAlchemy's formatting make it, in half their time: the request log binds one a row."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("naive datetimes are not stored")
    moment = value if value.tzinfo is UTC else value.astimezone(UTC)
    # isoformat() of an aware moment, less its "+00:00", took twice this
    return "%04d-%02d-%02d %02d:%02d:%02d.%06d" % (  # noqa: UP031
        moment.year,
        moment.month,
        moment.day,
        moment.hour,
        moment.minute,
        moment.second,
        moment.microsecond,
    )


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime, dict[str, Any]: JSON, list[Any]: JSON}


class Meta(Base):
    """Named values of the installation: the master-key check, the change marker, the audit log's head."""

    __tablename__ = "meta"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(512))


class Project(Base):
    __tablename__ = "projects"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH))
    rate_limit_per_minute: Mapped[int | None]
    # How many of the project's requests may be under way at once, streams included (None: no cap).
    max_concurrent_requests: Mapped[int | None]
    # Keys whose secret is older than this are flagged (panel, metric, an event); None: no policy.
    key_max_age_days: Mapped[int | None]
    # The web origins whose pages may call the proxy (CORS), each `scheme://host[:port]`.
    allowed_origins: Mapped[list[Any]] = mapped_column(default=list)
    # The identity provider whose end-user tokens (JWTs) the proxy accepts: {"jwks_url", "issuer", "audience"}.
    identity_provider: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # The rate limit of each end user (a client token's or an identity token's subject), apart from the project's.
    subject_rate_limit_per_minute: Mapped[int | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    tokens: Mapped[list["ProjectToken"]] = relationship(
        back_populates="project", cascade="all, delete-orphan", passive_deletes=True
    )
    integrations: Mapped[list["Integration"]] = relationship(
        back_populates="project", cascade="all, delete-orphan", passive_deletes=True
    )
    budgets: Mapped[list["Budget"]] = relationship(
        back_populates="project", cascade="all, delete-orphan", passive_deletes=True, order_by="Budget.created_at"
    )


class ProjectToken(Base):
    __tablename__ = "project_tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]

    project: Mapped[Project] = relationship(back_populates="tokens")


class AdminToken(Base):
    __tablename__ = "admin_tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    last_used_at: Mapped[datetime | None]
    # credgate.roles: "owner", "project_admin" or "viewer", and the projects granted (none for an owner).
    role: Mapped[str] = mapped_column(String(16), default="owner")
    project_ids: Mapped[list[Any]] = mapped_column(default=list)


class AdminUser(Base):
    __tablename__ = "admin_users"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    username: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH), unique=True)
    password_hash: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[datetime]
    role: Mapped[str] = mapped_column(String(16), default="owner")  # as AdminToken's
    project_ids: Mapped[list[Any]] = mapped_column(default=list)
    # "<issuer> <sub>" once the user has signed in through the identity provider; None for password users and
    # for users added for single sign-on who have not signed in yet.
    oidc_subject: Mapped[str | None] = mapped_column(String(512), unique=True, default=None)

    @property
    def has_password(self) -> bool:
        return bool(self.password_hash)  # single sign-on users have none: the empty hash verifies nothing


class Integration(Base):
    __tablename__ = "integrations"
    __table_args__ = (UniqueConstraint("project_id", "provider"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    provider: Mapped[str] = mapped_column(String(MAX_PROVIDER_NAME_LENGTH))
    base_url: Mapped[str] = mapped_column(String(MAX_URL_LENGTH))
    auth: Mapped[dict[str, Any]]
    templates: Mapped[list[Any]]
    endpoints: Mapped[list[Any]]
    headers: Mapped[dict[str, Any]]
    query: Mapped[dict[str, Any]]
    enabled: Mapped[bool]
    timeout_seconds: Mapped[float]
    # How long a started response may send nothing before it is cut off; rows older than the setting got 300.
    stream_idle_timeout_seconds: Mapped[float] = mapped_column(server_default=text("300"))
    # How long a request may take in all, its response included; rows older than the setting got 3600.
    total_timeout_seconds: Mapped[float] = mapped_column(server_default=text("3600"))
    # The admin's exceptions to the SSRF guard for this integration alone: normalised networks and host names.
    private_networks: Mapped[list[Any]] = mapped_column(default=list)
    # How a pool of keys is used: "failover" (in order, the next when one is out) or "spread" (taking turns).
    key_strategy: Mapped[str] = mapped_column(String(16), default="failover", server_default=text("'failover'"))
    # The admin's price list, in order: [{"model": glob, "input": USD per million tokens, "output": …}].
    prices: Mapped[list[Any]] = mapped_column(default=list)
    # The admin's call that checks a key ({"method", "path"}); None: the first `verify` of its templates, if any.
    verify_call: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    project: Mapped[Project] = relationship(back_populates="integrations")
    keys: Mapped[list["ProviderKey"]] = relationship(
        back_populates="integration",
        cascade="all, delete-orphan",
        passive_deletes=True,
        lazy="selectin",
        order_by="ProviderKey.position",
    )

    @property
    def key(self) -> "ProviderKey | None":
        """The pool's first key: what the single-key API, CLI and panel show and set."""
        return self.keys[0] if self.keys else None


class ProviderKey(Base):
    """One encrypted provider credential of an integration's pool; `ciphertext` is None once revoked."""

    __tablename__ = "provider_keys"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # stable across rotations of the pool
    integration_id: Mapped[str] = mapped_column(ForeignKey("integrations.id", ondelete="CASCADE"), index=True)
    label: Mapped[str] = mapped_column(String(MAX_KEY_LABEL_LENGTH), default="", server_default=text("''"))
    position: Mapped[int] = mapped_column(default=0, server_default=text("0"))  # the order failover follows
    ciphertext: Mapped[bytes | None] = mapped_column(LargeBinary)
    master_key_id: Mapped[str | None] = mapped_column(String(16), index=True)
    hint: Mapped[str | None] = mapped_column(String(8))
    disabled: Mapped[bool] = mapped_column(default=False, server_default=text("false"))  # by an admin
    # Set when the provider refused the key (401, 403): out of service until an admin puts it back.
    failed_at: Mapped[datetime | None]
    failure: Mapped[str | None] = mapped_column(String(200))
    sealed_at: Mapped[datetime | None]  # when its current secret was set (None: rows older than that; see created_at)
    retire_at: Mapped[datetime | None]  # set when another key was promoted over it: removed at that time
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    integration: Mapped[Integration] = relationship(back_populates="keys")

    @property
    def secret_since(self) -> datetime:
        """When its current secret was set: what its age counts from."""
        return self.sealed_at or self.created_at


class Budget(Base):
    """A project's spending limit for a period: requests, tokens or cost (micro-dollars), of one provider or all."""

    __tablename__ = "budgets"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    provider: Mapped[str | None] = mapped_column(String(MAX_PROVIDER_NAME_LENGTH))  # None: every provider
    metric: Mapped[str] = mapped_column(String(16))  # "requests", "tokens" or "cost"
    period: Mapped[str] = mapped_column(String(8))  # "day" or "month", calendar periods in UTC
    amount: Mapped[int] = mapped_column(BigInteger)  # the limit, in the metric's unit (cost: micro-dollars)
    # Tokens or micro-dollars held per request from its admission until its usage is known (0: none).
    reserve: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    thresholds: Mapped[list[Any]] = mapped_column(default=lambda: [80, 100])  # percents that raise an event
    # Counted for each end user (subject) apart, rather than for the project; requests without one are not counted.
    per_subject: Mapped[bool] = mapped_column(default=False, server_default=text("false"))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    project: Mapped[Project] = relationship(back_populates="budgets")


class Webhook(Base):
    """Where a project's events are posted, signed with its own secret (sealed, like a provider key)."""

    __tablename__ = "webhooks"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(String(MAX_URL_LENGTH))
    events: Mapped[list[Any]]  # the event types it receives; empty: every type
    secret_ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    master_key_id: Mapped[str] = mapped_column(String(16), index=True)
    enabled: Mapped[bool]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class Event(Base):
    """Something a project's webhooks hear of; `body` is the exact JSON posted (and signed)."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_project_id_created_at", "project_id", "created_at"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(64))
    # Events that must happen once whoever notices them (a threshold crossed, a key come of age) carry a key.
    once_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]


class EventDelivery(Base):
    """One event to one webhook: pending (with its next attempt), delivered, or failed after every retry."""

    __tablename__ = "event_deliveries"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("events.id", ondelete="CASCADE"))
    webhook_id: Mapped[str] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int]
    next_attempt_at: Mapped[datetime | None] = mapped_column(index=True)
    last_status: Mapped[int | None]  # the receiver's HTTP status
    last_error: Mapped[str | None] = mapped_column(String(200))
    delivered_at: Mapped[datetime | None]
    created_at: Mapped[datetime]

    event: Mapped[Event] = relationship(lazy="joined")


class AuditEvent(Base):
    """An entry of the audit log, a link of its hash chain (credgate.audit_chain); written only by
    `Repository.append_audit_event`."""

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_at", "at"),
        # One entry after each: should appends ever escape the head's lock, the second fails instead of forking.
        Index("ix_audit_events_previous_hash", "previous_hash", unique=True),
    )
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(MAX_ACTOR_LENGTH))
    action: Mapped[str] = mapped_column(String(64))
    project_id: Mapped[str | None] = mapped_column(String(32))
    provider: Mapped[str | None] = mapped_column(String(MAX_PROVIDER_NAME_LENGTH))
    # What changed, for the changes worth recording in full (an integration's private_networks); never a secret.
    detail: Mapped[dict[str, Any] | None]
    previous_hash: Mapped[str] = mapped_column(String(64))  # the entry before's hash; GENESIS for the first
    hash: Mapped[str] = mapped_column(String(64))  # SHA-256 (hex) of this entry's canonical form


class RequestRecord(Base):
    """One proxied request, for the project's request log and usage; bodies are never recorded."""

    __tablename__ = "request_records"
    __table_args__ = (
        Index("ix_request_records_project_at", "project_id", "at"),
        Index("ix_request_records_project_subject_at", "project_id", "subject", "at"),
    )
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    project_id: Mapped[str] = mapped_column(String(32))
    request_id: Mapped[str] = mapped_column(String(32))
    method: Mapped[str] = mapped_column(String(8))
    provider: Mapped[str] = mapped_column(String(MAX_PROVIDER_NAME_LENGTH))
    endpoint: Mapped[str] = mapped_column(String(2048))
    status: Mapped[int]
    duration_ms: Mapped[float]
    request_bytes: Mapped[int] = mapped_column(BigInteger)
    response_bytes: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int | None]
    completion_tokens: Mapped[int | None]
    model: Mapped[str | None] = mapped_column(String(200))  # as the response's usage named it
    cost_micros: Mapped[int | None] = mapped_column(BigInteger)  # priced by the integration's list, in µUSD
    # Passed every check of the gateway's (token, allow-list, rate limit, budgets): what a requests budget counts.
    admitted: Mapped[bool | None]
    subject: Mapped[str | None] = mapped_column(String(200))  # the end user, for a client or identity token


class AdminSession(Base):
    """A signed-in panel session; `id` is the SHA-256 of the cookie's secret, never the secret itself.

    It also carries the panel's state between two requests (services/panel_state.py), so that any process serves
    the next one, and the state ends with the session: messages to show once, with a one-time secret, and an
    Add-new-API set-up awaiting its review. Both secrets are sealed under the master key, bound to the session.
    """

    __tablename__ = "admin_sessions"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("admin_users.id", ondelete="CASCADE"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    last_seen_at: Mapped[datetime]
    # The last time its user proved who they are: the sign-in, or a confirmation (admin_ui/confirm_pages.py).
    authenticated_at: Mapped[datetime] = mapped_column(server_default=func.now())
    flash_messages: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True))
    flash_secret: Mapped[bytes | None] = mapped_column(LargeBinary)
    flash_at: Mapped[datetime | None]
    pending_setup: Mapped[bytes | None] = mapped_column(LargeBinary)
    pending_setup_at: Mapped[datetime | None]

    user: Mapped[AdminUser] = relationship(lazy="joined")
