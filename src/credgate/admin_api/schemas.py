"""Admin API schemas: `…In` is what a caller sends, `…Out` what it gets. Built from rows field by field,
so a secret can never be serialised by accident."""

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Generic, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from credgate.catalog import Template
from credgate.limits import (
    MAX_ENDPOINTS,
    MAX_KEY_LABEL_LENGTH,
    MAX_KEY_LENGTH,
    MAX_KEYS_PER_INTEGRATION,
    MIN_PASSWORD_LENGTH,
    ConcurrentRequests,
    ExpiresInSeconds,
    GraceSeconds,
    KeyMaxAgeDays,
    Name,
    RateLimitPerMinute,
    StreamIdleTimeoutSeconds,
    TemplateId,
    TimeoutSeconds,
    TotalTimeoutSeconds,
)
from credgate.netguard import PrivateNetworkList
from credgate.services.budgets import BudgetState, limit_of, reserve_of
from credgate.services.integrations import REMOVE, IntegrationChanges
from credgate.services.key_pools import key_state
from credgate.services.projects import current_token
from credgate.services.verification import Verification
from credgate.specs import (
    AuthSpec,
    BaseUrl,
    Endpoint,
    HeaderMap,
    IdentityProviderSpec,
    KeyStrategy,
    Origins,
    ProviderName,
    QueryMap,
    VerifyCall,
)
from credgate.spending import MICROS_PER_DOLLAR
from credgate.storage import UsageRow
from credgate.storage.models import (
    AdminToken,
    AdminUser,
    AuditEvent,
    EventDelivery,
    Integration,
    Project,
    ProjectToken,
    ProviderKey,
    RequestRecord,
    Webhook,
)

ApiKey = Annotated[SecretStr, Field(min_length=1, max_length=MAX_KEY_LENGTH)]
T = TypeVar("T")


def _has_unpaired_surrogate(value: object) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(char) < 0xE000 for char in value)
    if isinstance(value, dict):
        return any(_has_unpaired_surrogate(key) or _has_unpaired_surrogate(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_has_unpaired_surrogate(item) for item in value)
    return False


class In(BaseModel):
    """A request body. Strict: a number is a JSON number (never a string or a bool), and text is valid Unicode,
    which JSON's `\\ud800` escapes need not be (no database could store it)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _valid_unicode(cls, value: object) -> object:
        if _has_unpaired_surrogate(value):
            raise ValueError("may not hold unpaired surrogates")
        return value


class ItemsOut(BaseModel, Generic[T]):
    items: list[T]


# projects


class ProjectIn(In):
    name: Name


class ProjectPatchIn(In):
    name: Name | None = None
    rate_limit_per_minute: RateLimitPerMinute | None = None
    max_concurrent_requests: ConcurrentRequests | None = Field(
        default=None,
        description="how many of the project's requests may be under way at once (429 beyond); null: no cap",
    )
    key_max_age_days: KeyMaxAgeDays | None = Field(
        default=None, description="keys whose secret is older are flagged (panel, metric, event); null: no policy"
    )
    allowed_origins: Origins | None = Field(
        default=None, description="web origins (scheme://host[:port]) whose pages may call the proxy; replaces the list"
    )
    subject_rate_limit_per_minute: RateLimitPerMinute | None = Field(
        default=None, description="each end user's rate limit (a client or identity token's subject); null: none"
    )
    identity_provider: IdentityProviderSpec | None = Field(
        default=None, description="the identity provider whose end-user JWTs the proxy accepts; null: none"
    )


class TokenRotateIn(In):
    grace_seconds: GraceSeconds = 0
    expires_in_seconds: ExpiresInSeconds | None = None


class TokenOut(BaseModel):
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, token: ProjectToken) -> Self:
        return cls(
            prefix=token.prefix,
            created_at=token.created_at,
            expires_at=token.expires_at,
            last_used_at=token.last_used_at,
        )


class ProjectOut(BaseModel):
    id: str
    name: str
    rate_limit_per_minute: int | None
    max_concurrent_requests: int | None
    key_max_age_days: int | None
    created_at: datetime
    token: TokenOut | None
    allowed_origins: list[str]
    subject_rate_limit_per_minute: int | None
    identity_provider: IdentityProviderSpec | None

    @classmethod
    def of(cls, project: Project) -> Self:
        token = current_token(project)
        return cls(
            id=project.id,
            name=project.name,
            rate_limit_per_minute=project.rate_limit_per_minute,
            max_concurrent_requests=project.max_concurrent_requests,
            key_max_age_days=project.key_max_age_days,
            created_at=project.created_at,
            token=None if token is None else TokenOut.of(token),
            allowed_origins=list(project.allowed_origins),
            subject_rate_limit_per_minute=project.subject_rate_limit_per_minute,
            identity_provider=None
            if project.identity_provider is None
            else IdentityProviderSpec(**project.identity_provider),
        )


class ProjectSecretOut(BaseModel):
    """A project with its new token's value: the only response that ever shows it."""

    project: ProjectOut
    secret: str


# templates


class TemplateOut(BaseModel):
    """A template as the admin API shows it."""

    id: str
    provider: str
    name: str
    description: str
    base_url: str
    auth: dict[str, Any]
    endpoints: list[Endpoint]
    headers: dict[str, str]
    query: dict[str, str]

    @classmethod
    def of(cls, template: Template) -> Self:
        return cls(
            id=template.id,
            provider=template.provider,
            name=template.name,
            description=template.description,
            base_url=template.base_url,
            auth=template.auth.model_dump(),
            endpoints=list(template.endpoints),
            headers=dict(template.headers),
            query=dict(template.query),
        )


# integrations

PRIVATE_NETWORKS_HELP = (
    "Exceptions to the SSRF guard for this integration alone (admins only; audited): IP networks in CIDR form, "
    "single addresses or host names it may reach although they are not public, over plain http too. Link-local "
    "ranges and cloud metadata addresses are never allowed. [] removes every exception."
)
VERIFY_CALL_HELP = (
    "the call that checks a key (`verify`): {method: GET or POST, path under the base URL}, sent with the key and "
    "no body; without it, the template's own (a custom integration has none)"
)


class IntegrationIn(In):
    """Either a template (`template`, `api_key` at first setup, optional `base_url`) or a custom
    integration (`base_url`, `api_key`, optional `auth` and `verify_call`); either may list `private_networks`."""

    provider: ProviderName
    verify: bool = False
    template: TemplateId | None = None
    api_key: ApiKey | None = None
    base_url: BaseUrl | None = None
    auth: AuthSpec | None = None
    private_networks: PrivateNetworkList | None = Field(default=None, description=PRIVATE_NETWORKS_HELP)
    verify_call: VerifyCall | None = Field(default=None, description=VERIFY_CALL_HELP)


class IntegrationPatchIn(In):
    base_url: BaseUrl | None = None
    auth: AuthSpec | None = None
    enabled: bool | None = None
    headers: HeaderMap | None = None
    query: QueryMap | None = None
    timeout_seconds: TimeoutSeconds | None = None
    stream_idle_timeout_seconds: StreamIdleTimeoutSeconds | None = None
    total_timeout_seconds: TotalTimeoutSeconds | None = None
    private_networks: PrivateNetworkList | None = Field(default=None, description=PRIVATE_NETWORKS_HELP)
    key_strategy: KeyStrategy | None = Field(
        default=None, description="how a pool of keys is used: failover (in order) or spread (taking turns)"
    )
    verify_call: VerifyCall | None = Field(default=None, description=VERIFY_CALL_HELP + "; null removes it")

    def changes(self) -> IntegrationChanges:
        """The fields sent, as the service's partial update: a `verify_call` sent as null removes the call."""
        sent = {name: getattr(self, name) for name in self.model_fields_set}
        if "verify_call" in sent and sent["verify_call"] is None:
            sent["verify_call"] = REMOVE
        return IntegrationChanges(**sent)


class EndpointsIn(In):
    endpoints: Annotated[list[Endpoint], Field(max_length=MAX_ENDPOINTS)]


class KeyIn(In):
    api_key: ApiKey
    verify: bool = False  # make the template's cheap call and tell whether the provider accepts the key


class KeyOut(BaseModel):
    status: Literal["active", "revoked"]
    hint: str | None
    updated_at: datetime | None


class PoolKeyIn(In):
    api_key: ApiKey
    label: Annotated[str, Field(max_length=MAX_KEY_LABEL_LENGTH)] = ""


class PoolKeyPatchIn(In):
    label: Annotated[str, Field(max_length=MAX_KEY_LABEL_LENGTH)] | None = None
    disabled: bool | None = Field(default=None, description="false also puts back a key the provider refused")
    position: Annotated[int, Field(ge=0, le=MAX_KEYS_PER_INTEGRATION - 1)] | None = None


class PromoteIn(In):
    retire_previous_after_seconds: int | None = Field(
        default=None, description="remove the key that was first after this overlap; null keeps it"
    )


class PoolKeyOut(BaseModel):
    """One key of an integration's pool: never its secret, at most the hint of its last four characters."""

    id: str
    label: str
    position: int
    status: Literal["active", "disabled", "failed", "revoked"]
    hint: str | None
    failure: str | None  # why the provider's answer took it out of service
    failed_at: datetime | None
    secret_set_at: datetime  # what its age counts from
    retire_at: datetime | None  # when it will be removed (another key was promoted over it)
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, key: ProviderKey) -> Self:
        status = key_state(key)
        return cls(
            id=key.id,
            label=key.label,
            position=key.position,
            status=status,
            hint=key.hint if status != "revoked" else None,
            failure=key.failure,
            failed_at=key.failed_at,
            secret_set_at=key.secret_since,
            retire_at=key.retire_at,
            created_at=key.created_at,
            updated_at=key.updated_at,
        )


class PriceLine(BaseModel):
    """Models matching `model` (a glob, `gpt-4o*`; the first matching line wins) cost `input` and `output`
    dollars per million tokens."""

    model: str
    input: float
    output: float


class IntegrationOut(BaseModel):
    provider: str
    base_url: str
    auth: dict[str, Any]
    templates: list[str]
    endpoints: list[Endpoint]
    headers: dict[str, str]
    query: dict[str, str]
    enabled: bool
    timeout_seconds: float
    stream_idle_timeout_seconds: float
    total_timeout_seconds: float
    private_networks: list[str]
    key: KeyOut  # the pool's first key
    keys: list[PoolKeyOut]
    key_strategy: str
    prices: list[PriceLine]
    verify_call: VerifyCall | None  # the admin's own; null: its templates' `verify`, if any
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, integration: Integration) -> Self:
        key = integration.key
        active = key is not None and key.ciphertext is not None
        return cls(
            provider=integration.provider,
            base_url=integration.base_url,
            auth=dict(integration.auth),
            templates=list(integration.templates),
            endpoints=[Endpoint.model_validate(endpoint) for endpoint in integration.endpoints],
            headers=dict(integration.headers),
            query=dict(integration.query),
            enabled=integration.enabled,
            timeout_seconds=integration.timeout_seconds,
            stream_idle_timeout_seconds=integration.stream_idle_timeout_seconds,
            total_timeout_seconds=integration.total_timeout_seconds,
            private_networks=list(integration.private_networks),
            key=KeyOut(
                status="active" if active else "revoked",
                hint=key.hint if key is not None and active else None,
                updated_at=key.updated_at if key is not None else None,
            ),
            keys=[PoolKeyOut.of(each) for each in integration.keys],
            key_strategy=integration.key_strategy,
            prices=[PriceLine.model_validate(line) for line in integration.prices],
            verify_call=None if integration.verify_call is None else VerifyCall.model_validate(integration.verify_call),
            created_at=integration.created_at,
            updated_at=integration.updated_at,
        )


class PricesIn(In):
    prices: list[dict[str, Any]] = Field(description="lines of {model, input, output}, in order")


class BudgetIn(In):
    metric: Literal["requests", "tokens", "cost"]
    limit: int | float = Field(description="requests or tokens (whole), or dollars for cost")
    period: Literal["day", "month"]
    provider: str | None = Field(default=None, description="one provider's traffic only; all when absent")
    thresholds: list[int] = Field(default=[80, 100], description="percentages of the limit that raise an event")
    reserve: int | float = Field(
        default=0, description="tokens or cost budgets: held per request from admission until its usage is known"
    )
    per_subject: bool = Field(
        default=False, description="the limit holds for each end user (client or identity token subject) apart"
    )


class BudgetPatchIn(In):
    limit: int | float | None = None
    period: Literal["day", "month"] | None = None
    thresholds: list[int] | None = None
    reserve: int | float | None = None


class BudgetOut(BaseModel):
    """A budget and where it stands in its current period (UTC calendar day or month)."""

    id: str
    provider: str | None
    metric: str
    period: str
    limit: int | float  # dollars for cost
    spent: int | float  # so far this period, from the request log
    period_start: datetime
    resets_at: datetime
    thresholds: list[int]
    reserve: int | float  # held per request until its usage is known (dollars for cost)
    per_subject: bool  # for each end user apart; `spent` is then every end user's together
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, state: BudgetState) -> Self:
        budget = state.budget
        return cls(
            id=budget.id,
            provider=budget.provider,
            metric=budget.metric,
            period=budget.period,
            limit=limit_of(budget),
            spent=state.spent / MICROS_PER_DOLLAR if budget.metric == "cost" else state.spent,
            period_start=state.period_start,
            resets_at=state.resets_at,
            thresholds=list(budget.thresholds),
            reserve=reserve_of(budget),
            per_subject=budget.per_subject,
            created_at=budget.created_at,
            updated_at=budget.updated_at,
        )


class WebhookIn(In):
    url: str = Field(description="where events are posted: a public http(s) URL")
    events: list[str] = Field(default=[], description="the event types it takes; none: every type")


class WebhookPatchIn(In):
    url: str | None = None
    events: list[str] | None = None
    enabled: bool | None = None


class WebhookOut(BaseModel):
    """A webhook: never its secret, which only the answer that created it holds."""

    id: str
    url: str
    events: list[str]
    enabled: bool
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, webhook: Webhook) -> Self:
        return cls(
            id=webhook.id,
            url=webhook.url,
            events=list(webhook.events),
            enabled=webhook.enabled,
            created_at=webhook.created_at,
            updated_at=webhook.updated_at,
        )


class WebhookSecretOut(BaseModel):
    """A new webhook with its signing secret: the only answer that ever shows it."""

    webhook: WebhookOut
    secret: str


class EventOut(BaseModel):
    id: str
    type: str


class DeliveryOut(BaseModel):
    """One event to one webhook: its state, attempts and the receiver's last answer."""

    id: int
    event_id: str
    event_type: str
    webhook_id: str
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    next_attempt_at: datetime | None
    last_status: int | None
    last_error: str | None
    delivered_at: datetime | None
    created_at: datetime

    @classmethod
    def of(cls, delivery: EventDelivery) -> Self:
        return cls(
            id=delivery.id,
            event_id=delivery.event_id,
            event_type=delivery.event.type,
            webhook_id=delivery.webhook_id,
            status=delivery.status,
            attempts=delivery.attempts,
            next_attempt_at=delivery.next_attempt_at if delivery.status == "pending" else None,
            last_status=delivery.last_status,
            last_error=delivery.last_error,
            delivered_at=delivery.delivered_at,
            created_at=delivery.created_at,
        )


class VerificationOut(BaseModel):
    accepted: bool | None
    status: int | None
    message: str

    @classmethod
    def of(cls, verification: Verification) -> Self:
        return cls(accepted=verification.accepted, status=verification.status, message=verification.message)


class VerifiedIntegrationOut(IntegrationOut):
    """An integration, and what the provider said of its key (when `verify` was asked)."""

    verification: VerificationOut


# admins

RoleName = Literal["owner", "project_admin", "viewer"]  # credgate.roles.Role's values
MAX_GRANTED_PROJECTS = 1000  # a bound on the body; each id must name a project anyway
GrantedProjects = Annotated[
    list[str],
    Field(
        max_length=MAX_GRANTED_PROJECTS,
        description="project ids: none for an owner, one or more for a project admin, none for a viewer of every one",
    ),
]


class AdminUserIn(In):
    """A panel user: with a password, or `single_sign_on` (no password: it signs in through the identity provider
    as `username`, its verified email address)."""

    username: Name
    password: Annotated[SecretStr, Field(min_length=MIN_PASSWORD_LENGTH)] | None = None
    single_sign_on: bool = False
    role: RoleName = "owner"
    project_ids: GrantedProjects = []


class AdminTokenIn(In):
    name: Name
    role: RoleName = "owner"
    project_ids: GrantedProjects = []


class RoleIn(In):
    """Another role for an admin, and its projects (replacing the list)."""

    role: RoleName
    project_ids: GrantedProjects = []


class EndedSessionsOut(BaseModel):
    ended: int  # the panel sessions of the user that were open


class AdminUserOut(BaseModel):
    """A panel user: how it signs in, never its password's hash."""

    id: str
    username: str
    sign_in: Literal["password", "single_sign_on"]
    role: str
    project_ids: list[str]
    created_at: datetime

    @classmethod
    def of(cls, user: AdminUser) -> Self:
        return cls(
            id=user.id,
            username=user.username,
            sign_in="password" if user.has_password else "single_sign_on",
            role=user.role,
            project_ids=list(user.project_ids),
            created_at=user.created_at,
        )


class AdminTokenOut(BaseModel):
    """An admin token: its prefix, never its value or hash."""

    id: str
    name: str
    prefix: str
    role: str
    project_ids: list[str]
    created_at: datetime
    last_used_at: datetime | None

    @classmethod
    def of(cls, token: AdminToken) -> Self:
        return cls(
            id=token.id,
            name=token.name,
            prefix=token.prefix,
            role=token.role,
            project_ids=list(token.project_ids),
            created_at=token.created_at,
            last_used_at=token.last_used_at,
        )


class AdminTokenSecretOut(BaseModel):
    """A new admin token with its value: the only answer that ever shows it."""

    admin_token: AdminTokenOut
    secret: str


# records


class AuditEventOut(BaseModel):
    at: datetime
    actor: str
    action: str
    project_id: str | None
    provider: str | None
    detail: dict[str, Any] | None  # what changed, for the changes recorded in full (integration.private_networks)

    @classmethod
    def of(cls, event: AuditEvent) -> Self:
        return cls(
            at=event.at,
            actor=event.actor,
            action=event.action,
            project_id=event.project_id,
            provider=event.provider,
            detail=event.detail,
        )


class RequestRecordOut(BaseModel):
    at: datetime
    request_id: str
    method: str
    provider: str
    endpoint: str
    status: int
    duration_ms: float
    request_bytes: int
    response_bytes: int
    prompt_tokens: int | None
    completion_tokens: int | None
    model: str | None  # as the response's usage named it
    cost_usd: float | None  # by the integration's price list, where a line priced the model
    subject: str | None  # the end user of a client or identity token

    @classmethod
    def of(cls, record: RequestRecord) -> Self:
        return cls(
            at=record.at,
            request_id=record.request_id,
            method=record.method,
            provider=record.provider,
            endpoint=record.endpoint,
            status=record.status,
            duration_ms=record.duration_ms,
            request_bytes=record.request_bytes,
            response_bytes=record.response_bytes,
            prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens,
            model=record.model,
            cost_usd=None if record.cost_micros is None else record.cost_micros / MICROS_PER_DOLLAR,
            subject=record.subject,
        )


class UsageTotalsOut(BaseModel):
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, rows: Sequence[UsageRow]) -> Self:
        prompt = sum(row.prompt_tokens for row in rows)
        completion = sum(row.completion_tokens for row in rows)
        return cls(
            requests=sum(row.requests for row in rows),
            errors=sum(row.errors for row in rows),
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
        )


class UsageGroupOut(UsageTotalsOut):
    group: str


class UsageOut(BaseModel):
    since: datetime
    until: datetime
    group_by: Literal["provider", "day", "subject"] | None
    totals: UsageTotalsOut
    items: list[UsageGroupOut]

    @classmethod
    def of(cls, since: datetime, until: datetime, group_by: str | None, rows: Sequence[UsageRow]) -> Self:
        groups = [UsageGroupOut(group=row.group, **UsageTotalsOut.of([row]).model_dump()) for row in rows]
        return cls(
            since=since,
            until=until,
            group_by=group_by,
            totals=UsageTotalsOut.of(rows),
            items=groups if group_by else [],
        )
