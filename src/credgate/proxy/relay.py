"""Relay: the I/O half of the data plane, a raw ASGI app. Settles everything before the first byte
(token, integration, key, limits, upstream response headers), then streams the upstream's bytes back
exactly as received. After `http.response.start` an error can only abort the response.
"""

import asyncio
import functools
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.client_proto import ResponseHandler
from aiohttp.helpers import _EXC_SENTINEL
from starlette.types import Receive, Scope, Send
from yarl import URL

from credgate.config import Settings
from credgate.crypto import Secret
from credgate.error_responses import ERROR_HEADER, error_body
from credgate.errors import (
    BadGateway,
    Forbidden,
    GatewayTimeout,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    RequestTimeout,
    ServiceError,
    Unauthorized,
    Unavailable,
)
from credgate.proxy.guard import NonPublicAddress, PublicOnlyResolver
from credgate.proxy.limits import RateLimiter, retry_after_header
from credgate.proxy.oauth import TokenBroker
from credgate.proxy.plan import (
    check_method,
    check_target,
    endpoint_allowed,
    find_project_token,
    plan_upstream,
    response_headers,
    split_target,
)
from credgate.proxy.sigv4 import sign
from credgate.proxy.upstreams import Upstreams
from credgate.resolved import ResolvedIntegration
from credgate.services.access import Access, resolve_access
from credgate.services.context import Context
from credgate.services.integrations import store_rotated_refresh_token
from credgate.services.usage import (
    COUNTED_CONTENT_TYPES,
    KEPT_BODY_BYTES,
    TAIL_CHUNK_BYTES,
    ProxiedRequest,
    UsageRecorder,
)
from credgate.services.verification import Verification, verdict
from credgate.specs import METHODS, OAUTH2_METHODS, PROVIDER_NAME, AwsSigV4Auth, Endpoint

logger = logging.getLogger(__name__)
WATCH_DELAY_SECONDS = 0.2
_VERIFY_TIMEOUT = aiohttp.ClientTimeout(total=15)
UNAUTHORIZED_MESSAGE = "invalid project token or expired authentication"
# RFC 6750: a 401 names the scheme the client should use.
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="credgate"'}
_JSON_ERROR_HEADERS = [(b"content-type", b"application/json"), (ERROR_HEADER.encode(), b"true")]


def _not_public(provider: str) -> BadGateway:
    # One wording whatever the spelling of the base URL (a literal address or a name), so it tells nothing.
    return BadGateway(f"{provider}'s address is not public; refused (CREDGATE_ALLOW_PRIVATE_UPSTREAMS)")


def _internal_error(request_id: str) -> ServiceError:
    """A bug of credgate's own: logged with its traceback, answered in the envelope with nothing internal."""
    logger.exception("unexpected failure of request %s", request_id)
    return ServiceError(f"internal error (request id {request_id})")


def _unauthorized() -> Unauthorized:
    return Unauthorized(UNAUTHORIZED_MESSAGE, headers=_CHALLENGE)


class _BodyProblem(Exception):
    """The client's body could not be relayed."""


class _BodyTooLarge(_BodyProblem):
    pass


class _ClientGone(_BodyProblem):
    pass


class _ClientIdle(_BodyProblem):
    pass


class _FramingAwareResponseHandler(ResponseHandler):
    """aiohttp hands a parser error (broken chunk framing after good bytes, say) to the connection only, and a
    reader of the body then waits forever: hand it to the body too, so the relay cuts the response at once."""

    def set_exception(self, exc: BaseException, exc_cause: BaseException = _EXC_SENTINEL) -> None:
        payload = self._payload
        if payload is not None and not payload.is_eof():
            payload.set_exception(aiohttp.ClientPayloadError("the upstream broke the response's framing"), exc)
        super().set_exception(exc, exc_cause)


def _tls_context() -> ssl.SSLContext:
    """Verified TLS, built without the environment: Python's default context would write every session secret
    (and with it the provider keys on the wire) to a file named by SSLKEYLOGFILE."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # hostname checks and certificate verification on
    context.load_default_certs()
    return context


def create_http_session(
    *, allow_private_upstreams: bool, max_connections: int = 1000, resolver: AbstractResolver | None = None
) -> aiohttp.ClientSession:
    """The outbound client: raw bytes both ways, no redirects, no headers of its own, and (unless private
    upstreams are allowed) public addresses only, or what `resolver` admits (an integration's exceptions)."""
    connector = aiohttp.TCPConnector(
        limit=max_connections,
        limit_per_host=0,
        ttl_dns_cache=10,
        enable_cleanup_closed=True,
        resolver=None if allow_private_upstreams else resolver or PublicOnlyResolver(),
        ssl=_tls_context(),
    )
    connector._factory = functools.partial(_FramingAwareResponseHandler, loop=asyncio.get_running_loop())  # type: ignore[assignment]
    session = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
    )
    # aiohttp resends an idempotent request when a reused connection drops before the answer; a gateway must
    # not (the upstream may have acted on it). No public switch exists; its own test utilities set this one.
    session._retry_connection = False
    return session


class ProxyApp:
    """`/proxy/<provider>/<endpoint>`: authenticate, check, inject, forward, stream back, record."""

    def __init__(
        self,
        ctx: Context,
        settings: Settings,
        session: aiohttp.ClientSession,
        recorder: UsageRecorder,
        *,
        max_in_flight: int = 1000,
    ) -> None:
        self.ctx = ctx
        self.session = session
        self.recorder = recorder
        self.max_request_bytes = settings.max_request_bytes
        self.max_in_flight = max_in_flight
        self.client_idle_seconds = settings.client_body_timeout_seconds
        self.rate_limiter = RateLimiter()
        self.in_flight = 0
        self.allow_private_upstreams = settings.allow_private_upstreams
        # The shared public-only session, and one per integration's list of exceptions to the guard.
        self.upstreams = Upstreams(
            session,
            allow_private=settings.allow_private_upstreams,
            open_session=lambda resolver: create_http_session(allow_private_upstreams=False, resolver=resolver),
        )
        self.tokens = TokenBroker(
            self.upstreams,
            store_refresh_token=lambda project_id, provider, token: store_rotated_refresh_token(
                ctx, project_id=project_id, provider=provider, token=token
            ),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.in_flight >= self.max_in_flight:
            request_id = scope["state"]["request_id"]
            await _send_error(send, Unavailable(f"gateway overloaded; retry later (request id {request_id})"))
            return
        self.in_flight += 1
        try:
            await self._serve(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        provider, raw_endpoint = split_target(raw_path)
        try:
            check_method(scope["method"])
            access, token = await self._authenticate(scope, provider)
        except ServiceError as error:
            await _send_error(send, error)
            return
        except Exception:
            await _send_error(send, _internal_error(scope["state"]["request_id"]))
            return
        record = ProxiedRequest(
            at=datetime.now(UTC),
            project_id=access.project_id,
            token_hash=access.token_hash,
            request_id=scope["state"]["request_id"],
            method=scope["method"],
            provider=provider,
            endpoint=raw_endpoint,
        )
        try:
            integration, credential, length = self._authorize(scope, access, provider, raw_endpoint)
            await self._relay(scope, receive, send, integration, credential, length, raw_endpoint, record, token)
        except ServiceError as error:
            record.status = error.status
            record.response_bytes = await _send_error(send, error)
        except Exception:
            if record.status:
                raise  # the response has started: it can only be cut off (uvicorn closes the connection)
            internal = _internal_error(record.request_id)
            record.status = internal.status
            record.response_bytes = await _send_error(send, internal)
        finally:
            record.duration_ms = (time.perf_counter() - started) * 1000
            self.recorder.record(record)

    async def _authenticate(self, scope: Scope, provider: str) -> tuple[Access, str]:
        """The access the client's project token grants, and the token (which must go nowhere else)."""
        token = find_project_token(scope["headers"])
        if token is None:
            raise _unauthorized()
        # A malformed name is looked up as "" (it answers 400 once the token checks out), so it cannot become
        # a cache key of its own.
        lookup = provider if PROVIDER_NAME.fullmatch(provider) else ""
        try:
            access = await resolve_access(self.ctx, token=token, provider=lookup)
        except Exception:
            logger.exception("token lookup failed for request %s", scope["state"]["request_id"])
            raise Unavailable(f"storage unavailable (request id {scope['state']['request_id']})") from None
        if access is None:
            raise _unauthorized()
        return access, token

    def _authorize(
        self, scope: Scope, access: Access, provider: str, raw_endpoint: str
    ) -> tuple[ResolvedIntegration, Secret, int | None]:
        """The contract's checks after the token, in its order: 400, 404, 403, 413, 429. Returns the
        integration, its credential and the request's declared length."""
        segments = check_target(provider, raw_endpoint)
        integration = access.integration
        if integration is None:
            raise NotFound(f"this project has no integration {provider}")
        if not integration.enabled:
            raise Forbidden(f"integration {provider} is disabled")
        credential = integration.credential
        if credential is None:
            raise Forbidden(f"the provider key of {provider} is revoked; set a new key")
        method: str = scope["method"]
        if method not in METHODS or not endpoint_allowed(method, segments, integration.endpoints):
            raise Forbidden(f"{method} {'/'.join(segments)} is not an enabled endpoint of {provider}")
        length = _content_length(scope["headers"])
        if length is not None and length > self.max_request_bytes:
            raise PayloadTooLarge(f"request body over the limit of {self.max_request_bytes} bytes")
        if access.rate_limit_per_minute is not None:
            wait = self.rate_limiter.acquire(access.project_id, access.rate_limit_per_minute)
            if wait:
                raise RateLimited(
                    f"rate limit of {access.rate_limit_per_minute} requests per minute exceeded",
                    headers={"Retry-After": retry_after_header(wait)},
                )
        return integration, credential, length

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
    ) -> None:
        if integration.auth.method in OAUTH2_METHODS:
            credential = await self.tokens.access_token(
                project_id=record.project_id, integration=integration, secret=credential
            )
        if self._refuses(integration):
            raise _not_public(integration.provider)
        plan = plan_upstream(
            method=scope["method"],
            raw_endpoint=raw_endpoint,
            query_string=scope.get("query_string", b""),
            headers=scope["headers"],
            integration=integration,
            credential=credential,
            client_token=client_token,
        )
        # Once the body is read, the rest of receive() only reports a client that leaves: watch for it.
        watch = ClientWatch(receive)
        body = RequestBody(
            receive, limit=self.max_request_bytes, idle_seconds=self.client_idle_seconds, on_complete=watch.start
        )
        headers = plan.headers
        try:
            data = await body.first()
            if isinstance(integration.auth, AwsSigV4Auth):
                # A signature covers the body: read it whole (within the limit), then sign those exact bytes.
                data = await body.whole(data)
                headers = sign(
                    plan, data, spec=integration.auth, key=credential.reveal(), provider=integration.provider
                )
            elif not isinstance(data, bytes) and length is not None:
                headers = [*headers, ("Content-Length", str(length))]
            async with asyncio.timeout(integration.timeout_seconds):
                response = await self.upstreams.session_for(integration.private_networks).request(
                    plan.method, URL(plan.url, encoded=True), headers=headers, data=data, allow_redirects=False
                )
        except asyncio.CancelledError:
            watch.stop()
            if watch.absorb_cancellation():
                record.status = 499  # the client left before the upstream answered; the request is abandoned
                return
            raise
        except ServiceError:
            watch.stop()
            raise
        except (_BodyProblem, aiohttp.ClientError, OSError, ValueError) as error:
            watch.stop()
            # aiohttp wraps what the body generator raised, so the body's own state says what happened.
            record.request_bytes = body.received
            if isinstance(body.problem, _BodyTooLarge):
                raise PayloadTooLarge(f"request body over the limit of {self.max_request_bytes} bytes") from None
            if isinstance(body.problem, _ClientIdle):
                raise RequestTimeout("the request body was not sent in time") from None
            if body.problem is not None:
                record.status = 499  # the client left before its request was complete
                return
            if isinstance(error, TimeoutError) and not isinstance(error, aiohttp.ConnectionTimeoutError):
                raise GatewayTimeout(f"{integration.provider} did not answer in time") from None
            if isinstance(getattr(error, "os_error", None), NonPublicAddress):
                raise _not_public(integration.provider) from None
            logger.warning(
                "upstream %s unreachable for request %s: %s",
                integration.provider,
                record.request_id,
                type(error).__name__,
            )
            raise BadGateway(f"{integration.provider} could not be reached") from None
        record.request_bytes = body.received
        try:
            await self._stream_response(
                response, send, record, watch, plan.query_secrets, integration.stream_idle_timeout_seconds
            )
        except asyncio.CancelledError:
            if not watch.absorb_cancellation():
                raise
            logger.info("client left request %s after %d bytes", record.request_id, record.response_bytes)
        finally:
            watch.stop()
            response.release()  # or closes it, when its body was not read to the end

    async def verify_key(self, *, project_id: str, integration: ResolvedIntegration, call: Endpoint) -> Verification:
        """The verification call of a key (a `KeyVerifier`): placed, guarded and bounded like any request."""
        if integration.credential is None:
            return Verification(accepted=False, status=None, message="the key is revoked")
        try:
            credential = integration.credential
            if integration.auth.method in OAUTH2_METHODS:
                credential = await self.tokens.access_token(
                    project_id=project_id, integration=integration, secret=credential
                )
            if self._refuses(integration):
                raise BadGateway("the provider's address is not public")
            plan = plan_upstream(
                method="GET" if call.method == "*" else call.method,
                raw_endpoint=call.path,
                query_string=b"",
                headers=[],
                integration=integration,
                credential=credential,
            )
            headers = plan.headers
            if isinstance(integration.auth, AwsSigV4Auth):
                headers = sign(plan, b"", spec=integration.auth, key=credential.reveal(), provider=integration.provider)
            async with self.upstreams.session_for(integration.private_networks).request(
                plan.method,
                URL(plan.url, encoded=True),
                headers=headers,
                allow_redirects=False,
                timeout=_VERIFY_TIMEOUT,
            ) as response:
                await response.read()
                return verdict(response.status)
        except BadGateway as error:
            return Verification(accepted=None, status=None, message=error.message)
        except (aiohttp.ClientError, OSError):
            return Verification(accepted=None, status=None, message="the provider could not be reached")

    def _refuses(self, integration: ResolvedIntegration) -> bool:
        """Whether the base URL's host is refused by its spelling, within the integration's exceptions."""
        return self.upstreams.refuses(integration.base_url, integration.private_networks)

    async def _stream_response(
        self,
        response: aiohttp.ClientResponse,
        send: Send,
        record: ProxiedRequest,
        watch: "ClientWatch",
        query_secrets: tuple[str, ...],
        idle_seconds: float,
    ) -> None:
        headers = response_headers(response.raw_headers, secrets=query_secrets)
        content_type = response.headers.get("Content-Type", "")
        if content_type.startswith("text/event-stream") and "X-Accel-Buffering" not in response.headers:
            headers.append((b"x-accel-buffering", b"no"))  # so a front proxy does not hold events back
        record.status = response.status
        record.content_type = content_type
        record.content_encoding = response.headers.get("Content-Encoding", "")
        counts_tokens = content_type.startswith(COUNTED_CONTENT_TYPES)
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        content = response.content
        kept = 0
        try:
            while True:
                async with asyncio.timeout(idle_seconds):
                    chunk = await content.readany()
                done = content.at_eof()
                watch.finishing = done
                if chunk:
                    record.response_bytes += len(chunk)
                    if counts_tokens and kept < KEPT_BODY_BYTES:
                        record.head.append(chunk)
                        kept += len(chunk)
                    elif counts_tokens:
                        record.tail.append(chunk[-TAIL_CHUNK_BYTES:])
                await send({"type": "http.response.body", "body": chunk, "more_body": not done})
                if done:
                    return
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            # The response has started: it can only be cut short, never ended as if complete.
            logger.warning(
                "upstream broke the response of request %s after %d bytes: %s",
                record.request_id,
                record.response_bytes,
                type(error).__name__,
            )


class ClientWatch:
    """Notices a client that leaves once its request is read, and cancels the relay, so the upstream
    connection is freed whether the upstream is still thinking or streaming (uvicorn's `send` would just
    drop the bytes and let the relay run on).

    The watching task starts only if the relay is still running after `WATCH_DELAY_SECONDS`: a quick exchange
    costs a timer, not a task, and a slow one (a generation) notices a departed client within that delay."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._relay = asyncio.current_task()  # the relay, even when start() runs in aiohttp's body writer
        self.client_gone = False
        # uvicorn reports a disconnect once the response is complete, too: that one is not a client leaving.
        self.finishing = False

    def start(self) -> None:
        if self._relay is not None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(WATCH_DELAY_SECONDS, self._begin)

    def _begin(self) -> None:
        if self._relay is not None and not self._relay.done():
            self._task = asyncio.create_task(self._watch(self._relay))

    async def _watch(self, relay: asyncio.Task[object]) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        if not self.finishing:
            self.client_gone = True
            relay.cancel()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def absorb_cancellation(self) -> bool:
        """True (and the cancellation undone) when it was this watch that cancelled the relay."""
        task = asyncio.current_task()
        if self.client_gone and task is not None:
            task.uncancel()
            return True
        return False


class RequestBody:
    """The client's body as the upstream reads it: whole when it came in one piece, else streamed,
    counted against the limit and the client's idle time either way."""

    def __init__(self, receive: Receive, *, limit: int, idle_seconds: float, on_complete: Callable[[], None]) -> None:
        self._receive = receive
        self._on_complete = on_complete
        self._limit = limit
        self._idle = idle_seconds
        self.received = 0
        self.problem: _BodyProblem | None = None

    async def _next(self) -> tuple[bytes, bool]:
        try:
            async with asyncio.timeout(self._idle):
                message = await self._receive()
        except TimeoutError:
            self.problem = _ClientIdle()
            raise self.problem from None
        if message["type"] == "http.disconnect":
            self.problem = _ClientGone()
            raise self.problem
        chunk: bytes = message.get("body", b"")
        self.received += len(chunk)
        if self.received > self._limit:
            self.problem = _BodyTooLarge()
            raise self.problem
        more = bool(message.get("more_body", False))
        if not more:
            self._on_complete()
        return chunk, more

    async def first(self) -> bytes | AsyncIterator[bytes] | None:
        chunk, more = await self._next()
        if not more:
            return chunk or None
        return self._rest(chunk)

    async def whole(self, first: bytes | AsyncIterator[bytes] | None) -> bytes:
        """The whole body, from what `first()` returned."""
        if first is None or isinstance(first, bytes):
            return first or b""
        return b"".join([chunk async for chunk in first])

    async def _rest(self, first: bytes) -> AsyncIterator[bytes]:
        yield first
        more = True
        while more:
            chunk, more = await self._next()
            if chunk:
                yield chunk


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_error(send: Send, error: ServiceError) -> int:
    """Answer the service error; returns the body's size."""
    body = error_body(error.status, error.message)
    headers = [
        *_JSON_ERROR_HEADERS,
        (b"content-length", str(len(body)).encode()),
        *((name.lower().encode(), value.encode()) for name, value in error.headers.items()),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return len(body)
