"""Relay: the I/O half of the data plane, a raw ASGI app. Settles everything before the first byte
(token, integration, key, limits, upstream response headers), then streams the upstream's bytes back
exactly as received. After `http.response.start` an error can only abort the response.
"""

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from starlette.types import Message, Receive, Scope, Send
from yarl import URL

from credgate import client_tokens, metrics
from credgate.client_tokens import CLIENT_TOKEN_PREFIX, ClientGrant
from credgate.config import Settings
from credgate.crypto import Secret
from credgate.errors import (
    BadGateway,
    Forbidden,
    GatewayTimeout,
    PayloadTooLarge,
    PaymentRequired,
    RateLimited,
    RequestTimeout,
    ServiceError,
    Unauthorized,
    Unavailable,
    internal_error,
)
from credgate.fleet import RateLimiter, RateLimits, retry_after_header
from credgate.fleet.budgets import Budgets, LocalBudgets
from credgate.fleet.concurrency import LocalPlaces, Place, Places
from credgate.netguard import NO_PRIVATE_NETWORKS
from credgate.proxy.client import (
    CHALLENGE,
    BodyProblem,
    BodyTooLarge,
    ClientIdle,
    ClientWatch,
    FreeingSend,
    RequestBody,
    send_error,
)
from credgate.proxy.cors import CorsSend, origin_of, preflight_headers, preflight_of
from credgate.proxy.deadlines import Deadlines
from credgate.proxy.guard import NonPublicAddress
from credgate.proxy.http_client import UpstreamResponse
from credgate.proxy.key_pools import FAILOVER_MAX_BODY_BYTES, KeyPools
from credgate.proxy.minting import ClientTokenMinter
from credgate.proxy.oauth import TokenBroker
from credgate.proxy.plan import (
    IDENTITY_TOKEN_PREFIX,
    Headers,
    UpstreamRequest,
    admit,
    check_method,
    find_token,
    origin_allowed,
    plan_upstream,
    response_headers,
    split_target,
)
from credgate.proxy.sigv4 import sign
from credgate.proxy.upstreams import Upstreams
from credgate.resolved import PoolKey, ResolvedIntegration
from credgate.services.access import (
    LOOKUP_TIMEOUT_SECONDS,
    Access,
    directory,
    resolve_access,
    resolve_for_project,
    resolve_hashed,
)
from credgate.services.budgets import spent_since
from credgate.services.context import Context
from credgate.services.integrations import store_rotated_refresh_token
from credgate.services.key_pools import take_key_out_of_service
from credgate.services.usage import (
    ProxiedRequest,
    UsageRecorder,
)
from credgate.services.verification import Verification, verdict
from credgate.specs import OAUTH2_METHODS, PROVIDER_NAME, AwsSigV4Auth, Endpoint
from credgate.spending import rules_for
from credgate.storage import StorageUnavailable

if TYPE_CHECKING:  # the SDK is loaded only when tracing is on; PyJWT at the first identity token
    from credgate.identity import IdentityVerifier
    from credgate.tracing import RequestSpan, Tracing

logger = logging.getLogger(__name__)
_IN_FLIGHT, _STREAMS_OPEN = metrics.in_flight, metrics.streams_open
_VERIFY_TIMEOUT_SECONDS = 15
_WEBHOOK_TIMEOUT_SECONDS = 10
_JWKS_TIMEOUT_SECONDS = 10
_MAX_JWKS_BYTES = 1 << 20
_MAX_VERIFY_BODY_BYTES = 1 << 20
_MAX_REMEMBERED_GRANTS = 100_000
UNAUTHORIZED_MESSAGE = "invalid project token or expired authentication"
# RFC 6750: a 401 names the scheme the client should use.


class _PastTotalTimeout(Exception):
    """The integration's total timeout ran out while the response was being relayed."""


def _not_public(provider: str) -> BadGateway:
    # One wording whatever the spelling of the base URL (a literal address or a name), so it tells nothing.
    return BadGateway(f"{provider}'s address is not public; refused (CREDGATE_ALLOW_PRIVATE_UPSTREAMS)")


def _internal_error(request_id: str) -> ServiceError:
    """A bug of credgate's own: logged with its traceback, answered in the envelope with nothing internal."""
    logger.exception("unexpected failure of request %s", request_id)
    return internal_error(request_id)


def _unauthorized() -> Unauthorized:
    return Unauthorized(UNAUTHORIZED_MESSAGE, headers=dict(CHALLENGE))


class ProxyApp:
    """`/proxy/<provider>/<endpoint>`: authenticate, check, inject, forward, stream back, record."""

    def __init__(
        self,
        ctx: Context,
        settings: Settings,
        recorder: UsageRecorder,
        *,
        rate_limits: RateLimits | None = None,
        subject_limits: RateLimits | None = None,
        budgets: Budgets | None = None,
        places: Places | None = None,
        tracing: "Tracing | None" = None,
        max_in_flight: int = 1000,
        max_upstream_connections: int = 1000,
    ) -> None:
        """`rate_limits`, `budgets`, `places`: the fleet's shared counters where there are some; else this process
        counts alone (budgets from the request log). `tracing`: a span per request, when OpenTelemetry is configured.
        `max_upstream_connections`: the connections to upstreams open at once, in each pool."""
        self.ctx = ctx
        self.tracing = tracing
        self.recorder = recorder
        self.max_request_bytes = settings.max_request_bytes
        self.max_in_flight = max_in_flight
        self.client_idle_seconds = settings.client_body_timeout_seconds
        self.rate_limits: RateLimits = rate_limits or RateLimiter()
        # End users' counters apart from the projects': however many end users come, no project's count is lost.
        self.subject_limits: RateLimits = subject_limits or RateLimiter()
        self.budgets: Budgets = budgets or LocalBudgets(functools.partial(spent_since, ctx))
        self.places: Places = places or LocalPlaces()
        recorder.settle = self.budgets.settle
        self.deadlines = Deadlines()
        self.counts = metrics.RequestCounts()
        self.in_flight = 0
        self._in_flight_to_show = False  # the gauge is to be set at the end of this turn
        # The shared public-only pool, and one per integration's list of exceptions to the guard.
        self.upstreams = Upstreams(
            allow_private=settings.allow_private_upstreams,
            ports=settings.upstream_port_set,
            max_connections=max_upstream_connections,
        )
        self.key_pools = KeyPools(
            lambda project_id, provider, key_id, failure: take_key_out_of_service(
                ctx, project_id=project_id, provider=provider, key_id=key_id, failure=failure
            )
        )
        self._grants: dict[str, ClientGrant] = {}  # client tokens whose signature was checked
        self.minter = ClientTokenMinter(ctx)
        self._identities: IdentityVerifier | None = None
        self.tokens = TokenBroker(
            self.upstreams,
            store_refresh_token=lambda project_id, provider, token: store_rotated_refresh_token(
                ctx, project_id=project_id, provider=provider, token=token
            ),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "OPTIONS" and (preflight := preflight_of(scope["headers"])) is not None:
            await self._preflight(scope, send, *preflight)
            return
        if self.in_flight >= self.max_in_flight:
            request_id = scope["state"]["request_id"]
            await send_error(send, Unavailable(f"gateway overloaded; retry later (request id {request_id})"))
            return
        self.in_flight += 1
        self._show_in_flight()
        try:
            if self.tracing is None:
                await self._serve(scope, receive, send, None)
            else:
                await self._serve_traced(scope, receive, send, self.tracing)
        finally:
            self.in_flight -= 1
            self._show_in_flight()

    def _show_in_flight(self) -> None:
        """The gauge of requests under way is set once an event-loop turn, to the count at its end: not raised and
        lowered for each request, two calls into prometheus-client (and its lock) where a turn brings about 20."""
        if not self._in_flight_to_show:
            self._in_flight_to_show = True
            asyncio.get_running_loop().call_soon(self._set_in_flight_gauge)

    def _set_in_flight_gauge(self) -> None:
        self._in_flight_to_show = False
        _IN_FLIGHT.set(self.in_flight)

    async def _serve_traced(self, scope: Scope, receive: Receive, send: Send, tracing: "Tracing") -> None:
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        span = tracing.start_request(scope["method"], raw_path.decode("latin-1"), scope["headers"])
        status = 0

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._serve(scope, receive, send_noting_status, span)
        finally:
            record: ProxiedRequest | None = scope["state"].get("proxied")
            tokens_to_come = record is not None and record.counts_tokens and record.on_tokens is not None
            span.response_done(status or (record.status if record else 0), tokens_to_come=tokens_to_come)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, span: "RequestSpan | None") -> None:
        started = time.perf_counter()
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        provider, raw_endpoint = split_target(raw_path)
        origin = origin_of(scope["headers"])
        cors = None if origin is None else CorsSend(send, origin)
        if cors is not None:
            send = cors
        try:
            check_method(scope["method"])
            access, token, grant, subject = await self._authenticate(scope, provider)
        except ServiceError as error:
            if cors is not None:  # so that a page can read the 401 and mint a new token
                cors.allowed = await self._listed_anywhere(cors.origin)
            await send_error(send, error)
            return
        except Exception:
            await send_error(send, _internal_error(scope["state"]["request_id"]))
            return
        if cors is not None:
            cors.allowed = origin_allowed(cors.origin, access.allowed_origins, grant)
        record = ProxiedRequest(
            at=datetime.now(UTC),
            project_id=access.project_id,
            token_hash=access.token_hash,
            request_id=scope["state"]["request_id"],
            method=scope["method"],
            provider=provider,
            endpoint=raw_endpoint,
            started=started,
            subject=subject,
        )
        scope["state"]["proxied"] = record  # for the access line's fields
        # Only a provider the project has set up is a label: a client may not make up label values.
        label = provider if access.integration is not None else "-"
        if span is not None:
            span.identify(
                provider=label, project_id=access.project_id, request_id=record.request_id, endpoint=raw_endpoint
            )
            record.on_tokens = span.tokens_counted
        freeing: FreeingSend | None = None  # the send of a request with a place under the project's cap
        try:
            integration, credential, length, place = await self._authorize(
                scope, access, provider, raw_endpoint, record, grant=grant, origin=origin
            )
            if place is not None:
                send = freeing = FreeingSend(send, self.places, place)
            await self._relay(scope, receive, send, integration, credential, length, raw_endpoint, record, token, span)
        except ServiceError as error:
            record.status = error.status
            record.response_bytes = await send_error(send, error)
        except Exception:
            if record.status:
                raise  # the response has started: it can only be cut off (uvicorn closes the connection)
            internal = _internal_error(record.request_id)
            record.status = internal.status
            record.response_bytes = await send_error(send, internal)
        finally:
            if freeing is not None:
                freeing.give_back()
            duration = time.perf_counter() - started
            record.duration_ms = duration * 1000
            self.recorder.record(record)
            overhead = duration if record.overhead_ms is None else record.overhead_ms / 1000
            self.counts.served(access.project_id, label, record.status, duration, overhead)

    async def _authenticate(self, scope: Scope, provider: str) -> tuple[Access, str, ClientGrant | None, str | None]:
        """The access the client's token grants, the token (which must go nowhere else), a client token's grant,
        and the end user (subject) of a client or identity token."""
        token = find_token(scope["headers"])
        if token is None:
            raise _unauthorized()
        # A malformed name is looked up as "" (it answers 400 once the token checks out), so it cannot become
        # a cache key of its own.
        lookup = provider if PROVIDER_NAME.fullmatch(provider) else ""
        grant = subject = access = None
        try:
            if token.startswith(CLIENT_TOKEN_PREFIX):
                grant = self._grant(token)
                if grant is not None:
                    subject = grant.subject
                    # Alive while the project token that minted it is: the same lookup as that token's own.
                    access = await resolve_hashed(self.ctx, token_hash=grant.minted_by, provider=lookup)
            elif token.startswith(IDENTITY_TOKEN_PREFIX):
                access, subject = await self._identify(token, lookup)
            else:
                access = await resolve_access(self.ctx, token=token, provider=lookup)
        except StorageUnavailable:  # an outage, logged once by the database's watcher, not once a request
            raise Unavailable(f"storage unavailable (request id {scope['state']['request_id']})") from None
        except ServiceError:
            raise
        except Exception:
            logger.exception("token lookup failed for request %s", scope["state"]["request_id"])
            raise Unavailable(f"storage unavailable (request id {scope['state']['request_id']})") from None
        if access is None or (grant is not None and grant.project_id != access.project_id):
            raise _unauthorized()
        if subject is not None:
            metrics.subject_requests.labels(access.project_id).inc()
        return access, token, grant, subject

    def _grant(self, token: str) -> ClientGrant | None:
        """A client token's grant while it is valid: its signature checked once, then remembered; on every use,
        not expired and its master key still in the ring (a rotation ends the tokens signed before it)."""
        grant = self._grants.get(token)
        if grant is None:
            grant = client_tokens.read(self.ctx.keyring, token)
            if grant is None:
                return None
            if len(self._grants) >= _MAX_REMEMBERED_GRANTS:
                self._grants.clear()
            self._grants[token] = grant
        if grant.expires_at <= time.time() or not self.ctx.keyring.holds_key_of(grant.tag):
            self._grants.pop(token, None)
            return None
        return grant

    async def _identify(self, token: str, provider: str) -> tuple[Access | None, str | None]:
        """The access and subject of an end user's identity token: the project that trusts its issuer for its
        audience, once the signature and claims check out against that issuer's published keys."""
        from credgate.identity import (
            IdentityRefused,
            IdentityUnavailable,
            IdentityVerifier,
            unverified_issuer_and_audiences,
        )

        claimed = unverified_issuer_and_audiences(token)
        trusting = None if claimed is None else (await directory(self.ctx)).trusting(*claimed)
        if trusting is None:
            return None, None
        project_id, trusted = trusting
        if self._identities is None:
            self._identities = IdentityVerifier(self._fetch_keys)
        try:
            subject = await self._identities.subject(token, trusted)
        except IdentityRefused as refused:
            metrics.identity_refusals.labels(str(refused).replace(" ", "_")).inc()
            return None, None
        except IdentityUnavailable:
            raise Unavailable("the identity provider could not be reached; retry later") from None
        return await resolve_for_project(self.ctx, project_id=project_id, provider=provider), subject

    async def _fetch_keys(self, url: str) -> bytes:
        """An identity provider's JWKS (a `Fetch`): through the address guard, bounded, no redirect followed."""
        if self.upstreams.refuses(url, NO_PRIVATE_NETWORKS):
            raise NonPublicAddress("the identity provider's address is not public")
        async with asyncio.timeout(_JWKS_TIMEOUT_SECONDS):
            status, body = await self.upstreams.own_calls.fetch(
                "GET", URL(url), [("Accept", "application/json")], limit=_MAX_JWKS_BYTES
            )
        if status != 200:
            raise ValueError(f"the identity provider answered {status}")
        return body

    async def _listed_anywhere(self, origin: str) -> bool:
        """Whether some project lists `origin`: what a request without a usable token (a preflight, a 401) can
        be told."""
        try:
            return origin in (await directory(self.ctx)).origins
        except Exception:  # the answer stays a refusal; the database's watcher reports an outage
            return False

    async def _preflight(self, scope: Scope, send: Send, origin: str, requested: bytes) -> None:
        """A CORS preflight: it carries no token, so an origin any project lists is answered (204); the actual
        request is then held to its own project's list (403 otherwise)."""
        if not await self._listed_anywhere(origin):
            await send_error(send, Forbidden("this page's origin is not allowed to call this gateway"))
            return
        await send({"type": "http.response.start", "status": 204, "headers": preflight_headers(origin, requested)})
        await send({"type": "http.response.body", "body": b""})

    async def _authorize(
        self,
        scope: Scope,
        access: Access,
        provider: str,
        raw_endpoint: str,
        record: ProxiedRequest,
        *,
        grant: ClientGrant | None = None,
        origin: str | None = None,
    ) -> tuple[ResolvedIntegration, Secret, int | None, Place | None]:
        """The pure checks after the token (plan.admit), then the rate limits of the project and of its end user
        and its cap on requests under way (429), and the budgets (402), which count. With a cap, the request's
        place under it, for the caller to give back when the request ends."""
        admitted = admit(
            method=scope["method"],
            provider=provider,
            raw_endpoint=raw_endpoint,
            headers=scope["headers"],
            integration=access.integration,
            max_request_bytes=self.max_request_bytes,
            grant=grant,
            origin=origin,
            allowed_origins=access.allowed_origins,
        )
        subject = record.subject
        if subject is not None and access.subject_rate_limit_per_minute is not None:
            # First, so that one end user over their limit does not spend the project's for everyone else. A
            # counter per end user, named apart from every project's (an id holds no "/"), kept apart from them.
            counter = f"{access.project_id}/{subject}"
            await self._limit(self.subject_limits, counter, access.subject_rate_limit_per_minute, " per end user")
        if access.rate_limit_per_minute is not None:
            await self._limit(self.rate_limits, access.project_id, access.rate_limit_per_minute, "")
        place = None
        if access.max_concurrent_requests is not None:
            place = await self.places.take(access.project_id, access.max_concurrent_requests)
            if place is None:
                raise RateLimited(
                    f"{access.max_concurrent_requests} requests of this project are already under way",
                    headers={"Retry-After": "1"},
                )
        if access.budgets:
            try:
                await self._spend(access, record)
            except BaseException:
                if place is not None:
                    self.places.give_back(place)
                raise
        record.prices, record.admitted = admitted.integration.prices, True
        return admitted.integration, admitted.credential, admitted.declared_length, place

    @staticmethod
    async def _limit(limits: RateLimits, counter: str, per_minute: int, whose: str) -> None:
        wait = await limits.check(counter, per_minute)
        if wait:
            raise RateLimited(
                f"rate limit of {per_minute} requests per minute{whose} exceeded",
                headers={"Retry-After": retry_after_header(wait)},
            )

    async def _spend(self, access: Access, record: ProxiedRequest) -> None:
        """Admit the request by every budget that applies (a requests budget counts it), or 402; what the
        response spends of the others is settled by the recorder, from its usage."""
        rules = rules_for(access.budgets, record.subject)
        if not rules:  # only budgets per end user, and a request made for none
            return
        try:
            with self.deadlines.within(LOOKUP_TIMEOUT_SECONDS):  # a counter may start from the request log
                spent = await self.budgets.admit(access.project_id, rules, record.at)
        except Exception as error:
            if not isinstance(error, StorageUnavailable | TimeoutError):
                logger.exception("budget check failed for request %s", record.request_id)
            raise Unavailable(f"storage unavailable (request id {record.request_id})") from None
        if spent is not None:
            metrics.budget_refusals.labels(access.project_id).inc()
            resets = spent.window(record.at)[1]
            raise PaymentRequired(
                f"budget of {spent.describe()} spent; it resets at {resets:%Y-%m-%dT%H:%M:%SZ}",
                headers={"Retry-After": retry_after_header((resets - record.at).total_seconds())},
            )
        record.budgets = rules

    async def _relay(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        integration: ResolvedIntegration,
        credential: Secret,
        length: int | None,
        raw_endpoint: str,
        record: ProxiedRequest,
        client_token: str,
        span: "RequestSpan | None",
    ) -> None:
        # The keys to try, in turn, before any byte reaches the client: a pool's (those not resting, in the order
        # of its strategy), or the one credential.
        pooled = len(integration.keys) > 1
        keys: Sequence[PoolKey] = (
            self.key_pools.attempts(record.project_id, integration)
            if pooled
            else integration.keys or (PoolKey("", credential),)
        )
        if not keys:
            raise BadGateway(f"every key of {integration.provider} is out of service or cooling down")
        plan_with = functools.partial(
            self._prepare,
            project_id=record.project_id,
            integration=integration,
            method=scope["method"],
            raw_endpoint=raw_endpoint,
            query_string=scope.get("query_string", b""),
            headers=scope["headers"],
            client_token=client_token,
        )
        plan = await plan_with(credential=keys[0].secret)
        # Once the body is read, the rest of receive() only reports a client that leaves: watch for it.
        watch = ClientWatch(receive, self.deadlines)
        body = RequestBody(
            receive,
            limit=self.max_request_bytes,
            idle_seconds=self.client_idle_seconds,
            on_complete=watch.start,
            deadlines=self.deadlines,
        )
        try:
            data = await body.first()
            if isinstance(integration.auth, AwsSigV4Auth):
                # A signature covers the body: read it whole (within the limit), then sign those exact bytes.
                data = await body.whole(data)
            elif len(keys) > 1 and not isinstance(data, bytes | None):
                # Failover sends the body again: only one received whole, within the bound.
                if length is not None and length <= FAILOVER_MAX_BODY_BYTES:
                    data = await body.whole(data)
                else:
                    keys = keys[:1]
            record.overhead_ms = (time.perf_counter() - record.started) * 1000
            response = await self._send(plan, plan_with, keys, pooled, integration, data, length, span, record)
        except asyncio.CancelledError:
            watch.stop()
            if watch.absorb_cancellation():
                record.status = 499  # the client left before the upstream answered; the request is abandoned
                return
            raise
        except ServiceError:
            watch.stop()
            raise
        except (BodyProblem, OSError, ValueError) as error:
            watch.stop()
            # The upstream's side may fail because the client's body did: the body's own state says what happened.
            record.request_bytes = body.received
            if isinstance(body.problem, BodyTooLarge):
                raise PayloadTooLarge(f"request body over the limit of {self.max_request_bytes} bytes") from None
            if isinstance(body.problem, ClientIdle):
                raise RequestTimeout("the request body was not sent in time") from None
            if body.problem is not None:
                record.status = 499  # the client left before its request was complete
                return
            if isinstance(error, TimeoutError):
                self._upstream_failed(integration.provider, "timeout", span)
                raise GatewayTimeout(f"{integration.provider} did not answer in time") from None
            if isinstance(error, NonPublicAddress):
                self._upstream_failed(integration.provider, "not_public", span)
                raise _not_public(integration.provider) from None
            self._upstream_failed(integration.provider, "unreachable", span)
            logger.warning(
                "upstream %s unreachable for request %s: %s",
                integration.provider,
                record.request_id,
                type(error).__name__,
            )
            raise BadGateway(f"{integration.provider} could not be reached") from None
        record.request_bytes = body.received
        try:
            await self._stream_response(response, send, record, watch, plan.query_secrets, integration)
        except asyncio.CancelledError:
            if not watch.absorb_cancellation():
                raise
            logger.info("client left request %s after %d bytes", record.request_id, record.response_bytes)
        finally:
            watch.stop()
            response.release()  # or closes it, when its body was not read to the end

    async def _send(
        self,
        plan: UpstreamRequest,
        plan_with: Callable[..., Awaitable[UpstreamRequest]],
        keys: Sequence[PoolKey],
        pooled: bool,
        integration: ResolvedIntegration,
        data: bytes | AsyncIterator[bytes] | None,
        length: int | None,
        span: "RequestSpan | None",
        record: ProxiedRequest,
    ) -> UpstreamResponse:
        """The upstream's response: `plan` sent with `keys[0]`; with a pool, each next key (`plan_with` its
        credential) while the provider refuses one (401, 403) or has it wait (429, 402), the last one's response
        whatever it is."""
        for index, key in enumerate(keys):
            if index:
                plan = await plan_with(credential=key.secret)
            headers = plan.headers
            if isinstance(integration.auth, AwsSigV4Auth) and isinstance(data, bytes):  # always whole: read above
                secret = key.secret.reveal()
                headers = sign(plan, data, spec=integration.auth, key=secret, provider=integration.provider)
            elif not isinstance(data, bytes | None) and length is not None:
                headers = [*headers, ("Content-Length", str(length))]
            url = URL(plan.url, encoded=True)
            if span is not None:
                span.start_upstream(plan.method, url.host or "", url.port)
            left = record.started + integration.total_timeout_seconds - time.perf_counter()
            if left <= 0:  # nothing is sent (the provider would work, and bill, for an answer nobody waits for)
                raise TimeoutError
            with self.deadlines.within(min(integration.timeout_seconds, left)):
                response = await self.upstreams.connections_for(integration.private_networks).request(
                    plan.method, url, headers, data
                )
            if span is not None:
                span.upstream_answered(response.status)
            last = index == len(keys) - 1
            if not pooled or not self.key_pools.passes_over(record.project_id, integration, key, response, last=last):
                return response
            if last:
                return response
            response.release()
        raise AssertionError("unreachable: the last attempt's response is returned")

    @staticmethod
    def _upstream_failed(provider: str, kind: str, span: "RequestSpan | None") -> None:
        metrics.upstream_failures.labels(provider, kind).inc()
        if span is not None:
            span.upstream_failed(kind)

    async def verify_key(self, *, project_id: str, integration: ResolvedIntegration, call: Endpoint) -> Verification:
        """The verification call of a key (a `KeyVerifier`): placed, guarded and bounded like any request."""
        if integration.credential is None:
            return Verification(accepted=False, status=None, message="the key is revoked")
        try:
            plan = await self._prepare(
                project_id=project_id,
                integration=integration,
                credential=integration.credential,
                method="GET" if call.method == "*" else call.method,
                raw_endpoint=call.path,
                query_string=b"",
                headers=[],
            )
            headers = plan.headers
            if isinstance(integration.auth, AwsSigV4Auth):
                key = integration.credential.reveal()
                headers = sign(plan, b"", spec=integration.auth, key=key, provider=integration.provider)
            async with asyncio.timeout(_VERIFY_TIMEOUT_SECONDS):
                response = await self.upstreams.connections_for(integration.private_networks).request(
                    plan.method, URL(plan.url, encoded=True), headers
                )
                try:
                    # Read to its end to keep the connection; a longer body (a long list of models) is left unread.
                    with contextlib.suppress(ValueError):
                        await response.read(limit=_MAX_VERIFY_BODY_BYTES)
                finally:
                    response.release()
            return verdict(response.status)
        except BadGateway as error:
            return Verification(accepted=None, status=None, message=error.message)
        except (OSError, ValueError):  # TimeoutError among them
            return Verification(accepted=None, status=None, message="the provider could not be reached")

    async def post_event(self, url: str, body: bytes, headers: list[tuple[str, str]]) -> int:
        """Post a webhook's event (a `Poster`): through the address guard, bounded, never following a redirect."""
        if self.upstreams.refuses(url, NO_PRIVATE_NETWORKS):
            raise NonPublicAddress("the webhook's address is not public")
        async with asyncio.timeout(_WEBHOOK_TIMEOUT_SECONDS):
            response = await self.upstreams.own_calls.request("POST", URL(url), headers, body)
        response.release()  # its body is not read (it could be endless): unless it came whole, the connection closes
        return response.status

    async def _prepare(
        self,
        *,
        project_id: str,
        integration: ResolvedIntegration,
        credential: Secret,
        method: str,
        raw_endpoint: str,
        query_string: bytes,
        headers: Headers,
        client_token: str | None = None,
    ) -> UpstreamRequest:
        """The step a proxied request and a key verification share: the credential on the wire (an access
        token for OAuth 2.0 methods), the address guard on the base URL's spelling, then the pure plan."""
        if integration.auth.method in OAUTH2_METHODS:
            credential = await self.tokens.access_token(
                project_id=project_id, integration=integration, secret=credential
            )
        if self.upstreams.refuses(integration.base_url, integration.private_networks):
            raise _not_public(integration.provider)
        port = self.upstreams.refused_port(integration.base_url, integration.private_networks)
        if port is not None:
            raise BadGateway(f"{integration.provider}'s port {port} is not in CREDGATE_UPSTREAM_PORTS; refused")
        return plan_upstream(
            method=method,
            raw_endpoint=raw_endpoint,
            query_string=query_string,
            headers=headers,
            integration=integration,
            credential=credential,
            client_token=client_token,
        )

    async def _stream_response(
        self,
        response: UpstreamResponse,
        send: Send,
        record: ProxiedRequest,
        watch: ClientWatch,
        query_secrets: tuple[str, ...],
        integration: ResolvedIntegration,
    ) -> None:
        head_at = time.perf_counter()
        headers = response_headers(response.raw_headers, secrets=query_secrets)
        content_type = response.header("Content-Type") or ""
        streaming = content_type.startswith("text/event-stream")
        if streaming and response.header("X-Accel-Buffering") is None:
            headers.append((b"x-accel-buffering", b"no"))  # so a front proxy does not hold events back
        record.start_response(response.status, content_type, response.header("Content-Encoding") or "")
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        if record.overhead_ms is not None:
            record.overhead_ms += (time.perf_counter() - head_at) * 1000
        if streaming:
            _STREAMS_OPEN.inc()
        try:
            ends_at = record.started + integration.total_timeout_seconds
            await self._relay_body(response, send, record, watch, integration.stream_idle_timeout_seconds, ends_at)
        finally:
            if streaming:
                _STREAMS_OPEN.dec()

    async def _relay_body(
        self,
        response: UpstreamResponse,
        send: Send,
        record: ProxiedRequest,
        watch: ClientWatch,
        idle_seconds: float,
        ends_at: float,
    ) -> None:
        content = response
        try:
            while True:
                # What has arrived is sent at once; a timer is armed only to wait for more, and bounded by what is
                # left of the total timeout too.
                chunk = content.read_nowait()
                if not chunk and not content.is_eof():
                    left = ends_at - time.perf_counter()
                    try:
                        async with asyncio.timeout(min(idle_seconds, left)):
                            chunk = await content.read_any()
                    except TimeoutError:
                        if left <= idle_seconds:
                            raise _PastTotalTimeout from None
                        raise
                elif not content.is_eof() and time.perf_counter() >= ends_at:  # one that never lets the relay wait
                    raise _PastTotalTimeout
                done = content.at_eof()
                watch.finishing = done
                if chunk:
                    record.capture(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": not done})
                if done:
                    return
        except _PastTotalTimeout:
            logger.warning(
                "request %s cut off at its total timeout after %d bytes of response",
                record.request_id,
                record.response_bytes,
            )
        except (OSError, TimeoutError) as error:
            # The response has started: it can only be cut short, never ended as if complete.
            logger.warning(
                "upstream broke the response of request %s after %d bytes: %s",
                record.request_id,
                record.response_bytes,
                type(error).__name__,
            )
