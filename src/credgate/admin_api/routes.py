"""Admin API routes: each authenticates the admin, calls one service, and answers an `…Out` schema."""

from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any, Literal, Protocol

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from credgate.admin_api.schemas import (
    AdminTokenIn,
    AdminTokenOut,
    AdminTokenSecretOut,
    AdminUserIn,
    AdminUserOut,
    AuditEventOut,
    BudgetIn,
    BudgetOut,
    BudgetPatchIn,
    DeliveryOut,
    EndedSessionsOut,
    EndpointsIn,
    EventOut,
    IntegrationIn,
    IntegrationOut,
    IntegrationPatchIn,
    ItemsOut,
    KeyIn,
    PoolKeyIn,
    PoolKeyOut,
    PoolKeyPatchIn,
    PricesIn,
    ProjectIn,
    ProjectOut,
    ProjectPatchIn,
    ProjectSecretOut,
    PromoteIn,
    RequestRecordOut,
    RoleIn,
    TemplateOut,
    TokenRotateIn,
    UsageOut,
    VerificationOut,
    VerifiedIntegrationOut,
    WebhookIn,
    WebhookOut,
    WebhookPatchIn,
    WebhookSecretOut,
)
from credgate.error_responses import ERROR_RESPONSES
from credgate.errors import InvalidInput
from credgate.limits import ListLimit, Moment
from credgate.resolved import ResolvedIntegration
from credgate.roles import Principal
from credgate.services import admins, audit, budgets, events, integrations, key_pools, projects, usage, verification
from credgate.services.context import Context
from credgate.services.verification import Verification
from credgate.specs import Endpoint
from credgate.storage.models import Integration

_bearer = HTTPBearer(auto_error=False)


class AuthenticatedRoute(APIRoute):
    """Checks the admin token before anything else, the body included: a caller without a valid token
    learns nothing, not even whether its JSON would have parsed."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def authenticate_then_handle(request: Request) -> Response:
            principal = await admins.authenticate_bearer(get_context(request), request.headers.get("authorization", ""))
            _check_role(principal, request.method, self.path, request.path_params.get("project_id"))
            request.state.principal = principal
            return await handle(request)

        return authenticate_then_handle


# What only an owner may do, beyond any change that names no project (credgate.roles): the admins' reads too.
_OWNER_ONLY = {
    ("DELETE", "/api/v1/projects/{project_id}"),
    ("GET", "/api/v1/audit/export"),
    ("GET", "/api/v1/admin-users"),
    ("GET", "/api/v1/admin-tokens"),
}
# Reads that name no project and answer each admin what it may see, checked by the route itself.
_SELF_CHECKED_READS = {"/api/v1/projects", "/api/v1/templates", "/api/v1/audit"}


def _check_role(principal: Principal, method: str, path: str, project_id: str | None) -> None:
    """Every route's check, by its method and project, so that a new route cannot go unchecked: a read of a
    project needs `may_read`, any other method `may_change`; without a project, a change is the owner's."""
    reading = method in ("GET", "HEAD")
    if (method, path) in _OWNER_ONLY or (not reading and project_id is None):
        principal.require_owner(f"{method} {path}")
    elif project_id is not None:
        (principal.require_read if reading else principal.require_change)(project_id)
    elif path not in _SELF_CHECKED_READS:
        principal.require_read(None)


router = APIRouter(prefix="/api/v1", route_class=AuthenticatedRoute, responses=ERROR_RESPONSES)


class AdminRuntime(Protocol):
    """What the admin API needs of the running gateway (credgate.runtime.Runtime)."""

    @property
    def context(self) -> Context: ...

    async def verify_key(
        self, *, project_id: str, integration: ResolvedIntegration, call: Endpoint
    ) -> Verification: ...


def runtime_of(request: Request) -> AdminRuntime:
    """The runtime of the gateway serving the request, which the gateway puts in the request's state."""
    runtime: AdminRuntime = request.state.runtime
    return runtime


def get_context(request: Request) -> Context:
    return runtime_of(request).context


ContextDep = Annotated[Context, Depends(get_context)]


async def require_admin(
    request: Request, _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    """The acting admin, authenticated and its role checked by the route (declared here for OpenAPI)."""
    principal: Principal = request.state.principal
    return principal


async def require_actor(principal: Annotated[Principal, Depends(require_admin)]) -> str:
    """The acting admin's name for the audit log."""
    return principal.actor


Admin = Annotated[Principal, Depends(require_admin)]
Actor = Annotated[str, Depends(require_actor)]


# projects


@router.post("/projects", status_code=201)
async def create_project(body: ProjectIn, ctx: ContextDep, actor: Actor) -> ProjectSecretOut:
    project, secret = await projects.create_project(ctx, name=body.name, actor=actor)
    return ProjectSecretOut(project=ProjectOut.of(project), secret=secret)


@router.get("/projects")
async def list_projects(ctx: ContextDep, admin: Admin) -> ItemsOut[ProjectOut]:
    """The projects this admin may read."""
    found = [project for project in await projects.list_projects(ctx) if admin.may_read(project.id)]
    return ItemsOut(items=[ProjectOut.of(project) for project in found])


@router.get("/projects/{project_id}")
async def get_project(project_id: str, ctx: ContextDep, _actor: Actor) -> ProjectOut:
    return ProjectOut.of(await projects.get_project(ctx, project_id=project_id))


@router.patch("/projects/{project_id}")
async def update_project(project_id: str, body: ProjectPatchIn, ctx: ContextDep, actor: Actor) -> ProjectOut:
    changes = projects.ProjectChanges(
        name=body.name,
        rate_limit_per_minute=body.rate_limit_per_minute if "rate_limit_per_minute" in body.model_fields_set else ...,
        max_concurrent_requests=(
            body.max_concurrent_requests if "max_concurrent_requests" in body.model_fields_set else ...
        ),
        key_max_age_days=body.key_max_age_days if "key_max_age_days" in body.model_fields_set else ...,
        allowed_origins=body.allowed_origins,
        subject_rate_limit_per_minute=(
            body.subject_rate_limit_per_minute if "subject_rate_limit_per_minute" in body.model_fields_set else ...
        ),
        identity_provider=body.identity_provider if "identity_provider" in body.model_fields_set else ...,
    )
    return ProjectOut.of(await projects.update_project(ctx, project_id=project_id, changes=changes, actor=actor))


@router.delete("/projects/{project_id}", status_code=204)
async def delete_project(project_id: str, ctx: ContextDep, actor: Actor) -> Response:
    await projects.delete_project(ctx, project_id=project_id, actor=actor)
    return Response(status_code=204)


@router.post("/projects/{project_id}/token/rotate")
async def rotate_project_token(
    project_id: str, ctx: ContextDep, actor: Actor, body: TokenRotateIn | None = None
) -> ProjectSecretOut:
    body = body or TokenRotateIn()
    project, secret = await projects.rotate_project_token(
        ctx,
        project_id=project_id,
        grace_seconds=body.grace_seconds,
        expires_in_seconds=body.expires_in_seconds,
        actor=actor,
    )
    return ProjectSecretOut(project=ProjectOut.of(project), secret=secret)


@router.delete("/projects/{project_id}/token", status_code=204)
async def revoke_project_token(project_id: str, ctx: ContextDep, actor: Actor) -> Response:
    await projects.revoke_project_tokens(ctx, project_id=project_id, actor=actor)
    return Response(status_code=204)


# templates


@router.get("/templates")
async def list_templates(ctx: ContextDep, _actor: Actor) -> ItemsOut[TemplateOut]:
    return ItemsOut(items=[TemplateOut.of(template) for template in ctx.templates.values()])


# integrations


@router.post("/projects/{project_id}/integrations", status_code=201)
async def create_integration(
    project_id: str, body: IntegrationIn, ctx: ContextDep, actor: Actor, response: Response, request: Request
) -> VerifiedIntegrationOut | IntegrationOut:
    integration, created = await integrations.add_integration(
        ctx,
        project_id=project_id,
        provider=body.provider,
        template_id=body.template,
        api_key=body.api_key.get_secret_value() if body.api_key is not None else None,
        base_url=body.base_url,
        auth=body.auth,
        private_networks=body.private_networks,
        verify_call=body.verify_call,
        actor=actor,
    )
    if not created:
        response.status_code = 200
    return await _with_verification(request, ctx, project_id, integration, verify=body.verify)


@router.get("/projects/{project_id}/integrations")
async def list_integrations(project_id: str, ctx: ContextDep, _actor: Actor) -> ItemsOut[IntegrationOut]:
    found = await integrations.list_integrations(ctx, project_id=project_id)
    return ItemsOut(items=[IntegrationOut.of(integration) for integration in found])


@router.get("/projects/{project_id}/integrations/{provider}")
async def get_integration(project_id: str, provider: str, ctx: ContextDep, _actor: Actor) -> IntegrationOut:
    return IntegrationOut.of(await integrations.get_integration(ctx, project_id=project_id, provider=provider))


@router.patch("/projects/{project_id}/integrations/{provider}")
async def update_integration(
    project_id: str, provider: str, body: IntegrationPatchIn, ctx: ContextDep, actor: Actor
) -> IntegrationOut:
    changes = body.changes()
    integration = await integrations.update_integration(
        ctx, project_id=project_id, provider=provider, changes=changes, actor=actor
    )
    return IntegrationOut.of(integration)


@router.delete("/projects/{project_id}/integrations/{provider}", status_code=204)
async def delete_integration(project_id: str, provider: str, ctx: ContextDep, actor: Actor) -> Response:
    await integrations.delete_integration(ctx, project_id=project_id, provider=provider, actor=actor)
    return Response(status_code=204)


@router.put("/projects/{project_id}/integrations/{provider}/endpoints")
async def set_endpoints(
    project_id: str, provider: str, body: EndpointsIn, ctx: ContextDep, actor: Actor
) -> IntegrationOut:
    integration = await integrations.set_endpoints(
        ctx, project_id=project_id, provider=provider, endpoints=body.endpoints, actor=actor
    )
    return IntegrationOut.of(integration)


@router.put("/projects/{project_id}/integrations/{provider}/key")
async def set_provider_key(
    project_id: str, provider: str, body: KeyIn, ctx: ContextDep, actor: Actor, request: Request
) -> VerifiedIntegrationOut | IntegrationOut:
    integration = await integrations.set_provider_key(
        ctx, project_id=project_id, provider=provider, api_key=body.api_key.get_secret_value(), actor=actor
    )
    return await _with_verification(request, ctx, project_id, integration, verify=body.verify)


async def _with_verification(
    request: Request, ctx: Context, project_id: str, integration: Integration, *, verify: bool
) -> VerifiedIntegrationOut | IntegrationOut:
    """The integration, and when asked, what the provider said of its key (the key is saved either way)."""
    out = IntegrationOut.of(integration)
    if not verify:
        return out
    verifier = runtime_of(request).verify_key
    found = await verification.verify_provider_key(ctx, verifier, project_id=project_id, provider=integration.provider)
    return VerifiedIntegrationOut(**out.model_dump(), verification=VerificationOut.of(found))


@router.delete("/projects/{project_id}/integrations/{provider}/key")
async def revoke_provider_key(project_id: str, provider: str, ctx: ContextDep, actor: Actor) -> IntegrationOut:
    integration = await integrations.revoke_provider_key(ctx, project_id=project_id, provider=provider, actor=actor)
    return IntegrationOut.of(integration)


# key pools


@router.get("/projects/{project_id}/integrations/{provider}/keys")
async def list_pool_keys(project_id: str, provider: str, ctx: ContextDep, _actor: Actor) -> ItemsOut[PoolKeyOut]:
    integration = await integrations.get_integration(ctx, project_id=project_id, provider=provider)
    return ItemsOut(items=[PoolKeyOut.of(key) for key in integration.keys])


@router.post("/projects/{project_id}/integrations/{provider}/keys", status_code=201)
async def add_pool_key(project_id: str, provider: str, body: PoolKeyIn, ctx: ContextDep, actor: Actor) -> PoolKeyOut:
    _, key = await key_pools.add_key(
        ctx,
        project_id=project_id,
        provider=provider,
        api_key=body.api_key.get_secret_value(),
        label=body.label,
        actor=actor,
    )
    return PoolKeyOut.of(key)


@router.patch("/projects/{project_id}/integrations/{provider}/keys/{key_id}")
async def update_pool_key(
    project_id: str, provider: str, key_id: str, body: PoolKeyPatchIn, ctx: ContextDep, actor: Actor
) -> IntegrationOut:
    integration = await key_pools.update_key(
        ctx,
        project_id=project_id,
        provider=provider,
        key_id=key_id,
        actor=actor,
        label=body.label,
        disabled=body.disabled,
        position=body.position,
    )
    return IntegrationOut.of(integration)


@router.post("/projects/{project_id}/integrations/{provider}/keys/{key_id}/verify")
async def verify_pool_key(
    project_id: str, provider: str, key_id: str, ctx: ContextDep, _actor: Actor, request: Request
) -> VerificationOut:
    """The template's cheap call with this key, whatever its state: whether the provider accepts it."""
    verifier = runtime_of(request).verify_key
    found = await verification.verify_provider_key(
        ctx, verifier, project_id=project_id, provider=provider, key_id=key_id
    )
    return VerificationOut.of(found)


@router.post("/projects/{project_id}/integrations/{provider}/keys/{key_id}/promote")
async def promote_pool_key(
    project_id: str, provider: str, key_id: str, body: PromoteIn, ctx: ContextDep, actor: Actor
) -> IntegrationOut:
    """Put a key first and in service (verify it first); the key that was first is removed after the overlap."""
    integration = await key_pools.promote_key(
        ctx,
        project_id=project_id,
        provider=provider,
        key_id=key_id,
        retire_previous_after_seconds=body.retire_previous_after_seconds,
        actor=actor,
    )
    return IntegrationOut.of(integration)


@router.delete("/projects/{project_id}/integrations/{provider}/keys/{key_id}")
async def remove_pool_key(project_id: str, provider: str, key_id: str, ctx: ContextDep, actor: Actor) -> IntegrationOut:
    integration = await key_pools.remove_key(ctx, project_id=project_id, provider=provider, key_id=key_id, actor=actor)
    return IntegrationOut.of(integration)


# budgets and price lists


@router.get("/projects/{project_id}/budgets")
async def list_budgets(project_id: str, ctx: ContextDep, _actor: Actor) -> ItemsOut[BudgetOut]:
    return ItemsOut(items=[BudgetOut.of(state) for state in await budgets.list_budgets(ctx, project_id=project_id)])


@router.post("/projects/{project_id}/budgets", status_code=201)
async def add_budget(project_id: str, body: BudgetIn, ctx: ContextDep, actor: Actor) -> BudgetOut:
    budget = await budgets.add_budget(
        ctx,
        project_id=project_id,
        metric=body.metric,
        limit=body.limit,
        period=body.period,
        provider=body.provider,
        thresholds=body.thresholds,
        reserve=body.reserve,
        per_subject=body.per_subject,
        actor=actor,
    )
    return await _budget_out(ctx, project_id, budget.id)


async def _budget_out(ctx: Context, project_id: str, budget_id: str) -> BudgetOut:
    states = await budgets.list_budgets(ctx, project_id=project_id)
    return BudgetOut.of(next(state for state in states if state.budget.id == budget_id))


@router.patch("/projects/{project_id}/budgets/{budget_id}")
async def update_budget(
    project_id: str, budget_id: str, body: BudgetPatchIn, ctx: ContextDep, actor: Actor
) -> BudgetOut:
    await budgets.update_budget(
        ctx,
        project_id=project_id,
        budget_id=budget_id,
        limit=body.limit,
        period=body.period,
        thresholds=body.thresholds,
        reserve=body.reserve,
        actor=actor,
    )
    return await _budget_out(ctx, project_id, budget_id)


@router.delete("/projects/{project_id}/budgets/{budget_id}", status_code=204)
async def remove_budget(project_id: str, budget_id: str, ctx: ContextDep, actor: Actor) -> Response:
    await budgets.remove_budget(ctx, project_id=project_id, budget_id=budget_id, actor=actor)
    return Response(status_code=204)


@router.put("/projects/{project_id}/integrations/{provider}/prices")
async def set_prices(project_id: str, provider: str, body: PricesIn, ctx: ContextDep, actor: Actor) -> IntegrationOut:
    """Replace the price list that costs this integration's responses (cost budgets, the request log's cost)."""
    integration = await budgets.set_prices(
        ctx, project_id=project_id, provider=provider, prices=body.prices, actor=actor
    )
    return IntegrationOut.of(integration)


# events


@router.get("/projects/{project_id}/webhooks")
async def list_webhooks(project_id: str, ctx: ContextDep, _actor: Actor) -> ItemsOut[WebhookOut]:
    return ItemsOut(items=[WebhookOut.of(each) for each in await events.list_webhooks(ctx, project_id=project_id)])


@router.post("/projects/{project_id}/webhooks", status_code=201)
async def add_webhook(project_id: str, body: WebhookIn, ctx: ContextDep, actor: Actor) -> WebhookSecretOut:
    """A webhook for the project's events, with its signing secret: shown in this answer only."""
    webhook, secret = await events.add_webhook(
        ctx, project_id=project_id, url=body.url, events=body.events, actor=actor
    )
    return WebhookSecretOut(webhook=WebhookOut.of(webhook), secret=secret)


@router.patch("/projects/{project_id}/webhooks/{webhook_id}")
async def update_webhook(
    project_id: str, webhook_id: str, body: WebhookPatchIn, ctx: ContextDep, actor: Actor
) -> WebhookOut:
    webhook = await events.update_webhook(
        ctx,
        project_id=project_id,
        webhook_id=webhook_id,
        url=body.url,
        events=body.events,
        enabled=body.enabled,
        actor=actor,
    )
    return WebhookOut.of(webhook)


@router.delete("/projects/{project_id}/webhooks/{webhook_id}", status_code=204)
async def remove_webhook(project_id: str, webhook_id: str, ctx: ContextDep, actor: Actor) -> Response:
    await events.remove_webhook(ctx, project_id=project_id, webhook_id=webhook_id, actor=actor)
    return Response(status_code=204)


@router.post("/projects/{project_id}/webhooks/{webhook_id}/test", status_code=202)
async def test_webhook(project_id: str, webhook_id: str, ctx: ContextDep, actor: Actor) -> EventOut:
    """A `webhook.test` event for this webhook alone; its delivery shows in the log within seconds."""
    event = await events.send_test_event(ctx, project_id=project_id, webhook_id=webhook_id, actor=actor)
    return EventOut(id=event.id, type=event.type)


@router.get("/projects/{project_id}/deliveries")
async def list_deliveries(
    project_id: str,
    ctx: ContextDep,
    _actor: Actor,
    webhook_id: str | None = None,
    limit: Annotated[ListLimit, Query()] = 100,
) -> ItemsOut[DeliveryOut]:
    """The webhook delivery log, newest first."""
    found = await events.list_deliveries(ctx, project_id=project_id, webhook_id=webhook_id, limit=limit)
    return ItemsOut(items=[DeliveryOut.of(delivery) for delivery in found])


# admins (the owner's: a change names no project, and the reads are listed in _OWNER_ONLY)


@router.get("/admin-users")
async def list_admin_users(ctx: ContextDep, _actor: Actor) -> ItemsOut[AdminUserOut]:
    return ItemsOut(items=[AdminUserOut.of(user) for user in await admins.list_admin_users(ctx)])


@router.post("/admin-users", status_code=201)
async def create_admin_user(body: AdminUserIn, ctx: ContextDep, actor: Actor) -> AdminUserOut:
    """A panel user with a password, or (`single_sign_on`) one that signs in through the identity provider."""
    if (body.password is None) != body.single_sign_on:
        raise InvalidInput("password", 'give a password, or "single_sign_on": true for none')
    user = await admins.create_admin_user(
        ctx,
        username=body.username,
        password=None if body.password is None else body.password.get_secret_value(),
        role=body.role,
        project_ids=body.project_ids,
        actor=actor,
    )
    return AdminUserOut.of(user)


# `:path`: a username may hold a slash; the document shows the parameter as {username}.
@router.patch("/admin-users/{username:path}")
async def set_admin_user_role(username: str, body: RoleIn, ctx: ContextDep, actor: Actor) -> AdminUserOut:
    """Another role for a panel user, from its next page on; never the last owner's."""
    user = await admins.set_admin_role(
        ctx, username=username, role=body.role, project_ids=body.project_ids, actor=actor
    )
    return AdminUserOut.of(user)


@router.delete("/admin-users/{username:path}", status_code=204)
async def delete_admin_user(username: str, ctx: ContextDep, actor: Actor) -> Response:
    """Delete a panel user; its sessions end at once. Never the last owner."""
    await admins.delete_admin_user(ctx, username=username, actor=actor)
    return Response(status_code=204)


@router.delete("/admin-sessions/{username:path}")
async def end_admin_sessions(username: str, ctx: ContextDep, actor: Actor) -> EndedSessionsOut:
    """End every panel session of a user at once; it signs in again at its next page."""
    return EndedSessionsOut(ended=await admins.end_admin_sessions(ctx, username=username, actor=actor))


@router.get("/admin-tokens")
async def list_admin_tokens(ctx: ContextDep, _actor: Actor) -> ItemsOut[AdminTokenOut]:
    return ItemsOut(items=[AdminTokenOut.of(token) for token in await admins.list_admin_tokens(ctx)])


@router.post("/admin-tokens", status_code=201)
async def create_admin_token(body: AdminTokenIn, ctx: ContextDep, actor: Actor) -> AdminTokenSecretOut:
    """A new admin token with its value: shown in this answer only."""
    token, secret = await admins.issue_admin_token(
        ctx, name=body.name, role=body.role, project_ids=body.project_ids, actor=actor
    )
    return AdminTokenSecretOut(admin_token=AdminTokenOut.of(token), secret=secret)


@router.patch("/admin-tokens/{token_id}")
async def set_admin_token_role(token_id: str, body: RoleIn, ctx: ContextDep, actor: Actor) -> AdminTokenOut:
    """Another role for an admin token, from its next request on; never the last owner's."""
    token = await admins.set_admin_token_role(
        ctx, token_id=token_id, role=body.role, project_ids=body.project_ids, actor=actor
    )
    return AdminTokenOut.of(token)


@router.delete("/admin-tokens/{token_id}", status_code=204)
async def revoke_admin_token(token_id: str, ctx: ContextDep, actor: Actor) -> Response:
    """Revoke an admin token: its next request is refused. Never the last owner."""
    await admins.revoke_admin_token(ctx, token_id=token_id, actor=actor)
    return Response(status_code=204)


# records


@router.get("/projects/{project_id}/requests")
async def list_requests(
    project_id: str, ctx: ContextDep, _actor: Actor, limit: Annotated[ListLimit, Query()] = 100
) -> ItemsOut[RequestRecordOut]:
    records = await usage.list_request_records(ctx, project_id=project_id, limit=limit)
    return ItemsOut(items=[RequestRecordOut.of(record) for record in records])


@router.get("/projects/{project_id}/usage")
async def get_usage(
    project_id: str,
    ctx: ContextDep,
    _actor: Actor,
    since: Moment | None = None,
    until: Moment | None = None,
    group_by: Literal["provider", "day", "subject"] | None = None,
) -> UsageOut:
    since, until, rows = await usage.summarize_usage(
        ctx, project_id=project_id, since=since, until=until, group_by=group_by
    )
    return UsageOut.of(since, until, group_by, rows)


@router.get("/audit")
async def list_audit_events(
    ctx: ContextDep,
    admin: Admin,
    limit: Annotated[ListLimit, Query()] = 100,
    project_id: str | None = None,
) -> ItemsOut[AuditEventOut]:
    """The newest entries; of one project, or (for an admin that may read every project) of all."""
    admin.require_read(project_id)
    events = await audit.list_audit_events(ctx, limit=limit, project_id=project_id)
    return ItemsOut(items=[AuditEventOut.of(event) for event in events])


_NDJSON = "application/x-ndjson"


@router.get(
    "/audit/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Every audit entry, oldest first, one JSON object per line with `previous_hash` and `hash`.",
            "content": {_NDJSON: {"schema": {"type": "string"}}},
        }
    },
)
async def export_audit_log(ctx: ContextDep, _actor: Actor) -> StreamingResponse:
    """The whole audit log as its hash chain (JSON Lines), for `credgate audit verify`."""
    lines = audit.export_audit_log(ctx)
    first = await anext(lines, None)  # the database answers before the first byte, or the usual error answers

    async def body() -> AsyncIterator[str]:
        if first is not None:
            yield first
            async for line in lines:
                yield line

    return StreamingResponse(body(), media_type=_NDJSON)
