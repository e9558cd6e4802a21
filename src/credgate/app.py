"""create_app(): the one place where the gateway is assembled: control app, proxy, lifespan, errors.

`/proxy/…` goes to the data plane without passing through the control app's routing and middleware; the health
checks, /metrics and the lifespan are the Gateway's own; everything else (admin API, panel) goes to the FastAPI
control app, built at its first request: a worker that serves only the proxy and the metrics never loads FastAPI,
the admin API or the panel. With an admin listener configured, the main listener serves only the proxy and health,
and the admin listener everything but the proxy.
"""

import asyncio
import functools
import logging
import os
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.routing import Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from credgate import __version__, metrics
from credgate.config import Settings
from credgate.error_responses import error_response, service_error_response
from credgate.errors import ServiceError, internal_error
from credgate.log_format import AccessLog
from credgate.log_format import request_id as current_request_id
from credgate.proxy import ProxyApp
from credgate.proxy.minting import PATH as MINTING_PATH
from credgate.proxy.minting import MintedToken, MintRequest
from credgate.runtime import Runtime
from credgate.services import admins
from credgate.services.bootstrap import open_context
from credgate.services.context import Context
from credgate.services.usage import ProxiedRequest

if TYPE_CHECKING:
    from fastapi import FastAPI

logger = logging.getLogger(__name__)
REQUEST_ID_HEADER = b"x-request-id"
CREDGATE_REQUEST_ID_HEADER = b"x-credgate-request-id"
_READY_TIMEOUT_SECONDS = 2.0
_HEALTH_PATHS = frozenset({b"/healthz", b"/readyz"})
METRICS_PATH = b"/metrics"  # outside /api/v1, where Prometheus looks for it
_NOT_FOUND = error_response(404, "not found")
App = TypeVar("App", bound=ASGIApp)


class Gateway:
    """The ASGI entry point: gives every HTTP request an id, logs it, and routes it to its plane. It runs the
    lifespan and answers the health checks and /metrics itself; the control app is built at the first request for
    it."""

    def __init__(self, runtime: Runtime, build_control: Callable[[], "FastAPI"]) -> None:
        self.runtime = runtime
        self._control = BuiltOnFirstUse(build_control)
        self._panel = BuiltOnFirstUse(lambda: _panel(runtime))
        # X-Forwarded-For from a trusted front proxy names the client for the panel's sign-in throttle (uvicorn's
        # own reading of it, on the same setting); the proxy plane has no use for the address and skips it.
        trusted = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")
        self._control_plane: ASGIApp = ProxyHeadersMiddleware(self._control, trusted_hosts=trusted)  # type: ignore[arg-type,assignment]
        self._lifespan = Router(lifespan=lambda _app: runtime.running())
        self._json_logs = runtime.settings.log_format == "json"
        self._access_log = AccessLog()
        admin_listener = runtime.settings.admin_listener
        self._admin_port = None if admin_listener is None else admin_listener[1]

    @property
    def control(self) -> "FastAPI":
        """The control app (admin API, panel), built now if no request has needed it yet."""
        return self._control.app

    @property
    def proxy(self) -> ProxyApp | None:
        return self.runtime.proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "http":  # a WebSocket: nothing here takes one, so it is refused before any app is built
            await send({"type": "websocket.close", "code": 1000})
            return
        request_id = secrets.token_hex(8)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        if self._json_logs:
            current_request_id.set(request_id)  # for every line written while serving it
        started = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
                ours = request_id.encode()
                headers.append((CREDGATE_REQUEST_ID_HEADER, ours))
                # An upstream's own X-Request-Id (OpenAI's, for its support) is relayed unchanged, not doubled.
                for name, _ in headers:
                    if name.lower() == REQUEST_ID_HEADER:
                        break
                else:  # a loop, not any() over a generator: a third of the instructions
                    headers.append((REQUEST_ID_HEADER, ours))
                message["headers"] = headers
            await send(message)

        # Routed and logged on the path as received: the decoded one may hide a `/proxy/` or a line break.
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        app = self._plane(scope, raw_path)
        if app is self._control_plane:  # the control app is the process's; the runtime and panel, this gateway's
            state["runtime"], state["panel"] = self.runtime, self._panel
        try:
            await app(scope, receive, send_with_id)
        except Exception:
            if status:
                raise  # the response has started: it can only be cut off (uvicorn closes the connection)
            # Each plane answers its own errors; this is a failure outside them (building the control app, say).
            logger.exception("unexpected failure of request %s", request_id)
            await service_error_response(internal_error(request_id))(scope, receive, send_with_id)
        finally:
            # The path only: a query string may carry values that are not ours to log.
            path, duration_ms = raw_path.decode("latin-1"), (time.perf_counter() - started) * 1000
            fields = _access_fields(scope["method"], path, status, duration_ms, state) if self._json_logs else None
            message = f"{scope['method']} {path} {status} {duration_ms:.1f}ms {request_id}"
            self._access_log.write(message, request_id, fields)

    def _plane(self, scope: Scope, raw_path: bytes) -> ASGIApp:
        proxy = self.runtime.proxy
        if raw_path == MINTING_PATH and proxy is not None and not self._on_admin_listener(scope):
            return proxy.minter  # where the proxy is: an app's backend calls it beside its proxied calls
        if raw_path in _HEALTH_PATHS:
            return self._health  # on every listener
        proxied = raw_path.startswith(b"/proxy/")
        if self._admin_port is None:
            return proxy if proxied and proxy is not None else self._control_for(raw_path)
        if self._on_admin_listener(scope):
            return _NOT_FOUND if proxied else self._control_for(raw_path)
        if proxied:
            return proxy if proxy is not None else self._control_plane
        return _NOT_FOUND

    def _control_for(self, raw_path: bytes) -> ASGIApp:
        """What answers a path off the proxy: /metrics is the gateway's own, the rest the control app's."""
        return self._metrics if raw_path == METRICS_PATH else self._control_plane

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        """/healthz: the process answers; /readyz: and its database does too (503 otherwise)."""
        if scope["method"] not in ("GET", "HEAD"):
            response = error_response(405, "method not allowed", {"Allow": "GET, HEAD"})
        elif scope["path"] == "/healthz":
            response = JSONResponse({"status": "ok"})
        else:
            response = await self._readiness()
        await response(scope, receive, send)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """/metrics, served without the control app: Prometheus scrapes every worker, and FastAPI with the admin
        API would cost each about 12 MB. Open on the admin listener, where Prometheus expects it; on the one
        listener, behind an admin token that may read every project, as the admin API would check it."""
        if scope["method"] != "GET":
            await error_response(405, "method not allowed", {"Allow": "GET"})(scope, receive, send)
            return
        try:
            if self._admin_port is None:
                authorization = Headers(scope=scope).get("authorization", "")
                principal = await admins.authenticate_bearer(self.runtime.context, authorization)
                principal.require_read(None)
        except ServiceError as error:
            await service_error_response(error)(scope, receive, send)
            return
        body, content_type = metrics.exposition()
        await Response(body, media_type=content_type)(scope, receive, send)

    async def _readiness(self) -> Response:
        try:
            ctx = self.runtime.context
        except ServiceError as error:  # not started yet, or stopping
            return service_error_response(error)
        # Waited for without cancelling it on the spot: cancelling a query on a hung connection would wait on
        # that connection again (to roll back), and /readyz would hang with it.
        ping = asyncio.ensure_future(ctx.database.ping())
        done, _ = await asyncio.wait({ping}, timeout=_READY_TIMEOUT_SECONDS)
        if not done:
            ping.cancel()
            ping.add_done_callback(lambda finished: finished.cancelled() or finished.exception())
            return error_response(503, "storage unavailable")
        if ping.exception() is not None:
            return error_response(503, "storage unavailable")
        return JSONResponse({"status": "ready"})

    def _on_admin_listener(self, scope: Scope) -> bool:
        # Which listener took the connection: its own address, as the server reports it (never a client's header).
        return self._admin_port is not None and scope["server"] is not None and scope["server"][1] == self._admin_port


def _access_fields(method: str, path: str, status: int, duration_ms: float, state: dict[str, Any]) -> dict[str, Any]:
    """The access line's fields in JSON logs; a proxied request's project, provider and byte counts with them."""
    fields: dict[str, Any] = {"method": method, "path": path, "status": status, "duration_ms": round(duration_ms, 2)}
    proxied: ProxiedRequest | None = state.get("proxied")
    if proxied is not None:
        fields |= {
            "project": proxied.project_id,
            "provider": proxied.provider,
            "request_bytes": proxied.request_bytes,
            "response_bytes": proxied.response_bytes,
        }
    return fields


class BuiltOnFirstUse(Generic[App]):
    """An ASGI app built when its first request comes."""

    def __init__(self, build: Callable[[], App]) -> None:
        self._build = build
        self._app: App | None = None

    @property
    def app(self) -> App:
        if self._app is None:
            self._app = self._build()
        return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def _panel(runtime: Runtime) -> ASGIApp:
    # Imported on the panel's first request: its templates (Jinja2) cost each worker about 10 MB, and a worker
    # that serves only the proxy never needs them.
    from credgate.admin_ui import create_panel
    from credgate.admin_ui.sso_pages import SingleSignOn

    return create_panel(lambda: runtime.context, runtime.verify_key, SingleSignOn.of(runtime.settings))


@functools.cache
def _control_app() -> "FastAPI":
    """The admin API and the panel. Imported at its first request: FastAPI and the admin API's routes and schemas
    cost a worker about 12 MB (bench/memory.py) and its start about 0.5 s, which a worker serving only the proxy
    saves.

    One per process, whichever gateway serves it: FastAPI readies each route at its first request, about 20 ms
    each, and a process that builds many gateways (the tests) would pay that for each. A request finds its
    gateway's runtime and panel in its scope's state (`runtime`, `panel`)."""
    from fastapi import FastAPI

    from credgate.admin_api.routes import router as admin_api_router
    from credgate.error_responses import install_error_handlers

    control = FastAPI(
        title="credgate admin API",
        version=__version__,
        openapi_url="/api/v1/openapi.json",
        docs_url=None,
        redoc_url=None,
        # FastAPI (0.142 on) traces, measures and logs each request once a process-wide OpenTelemetry provider
        # exists, as `opentelemetry-instrument` sets one: the panel's URLs, the setup link's token among them, would
        # be exported. credgate's own spans cover the proxy; the admin plane sends nothing.
        telemetry={
            "tracing": False,
            "metrics": False,
            "logs": False,
            "operation_spans": False,
            "auto_configure": False,
        },
    )
    install_error_handlers(control)
    control.include_router(admin_api_router)
    control.mount("/admin", _gateways_panel)
    _document_minting(control)
    return control


def _document_minting(control: "FastAPI") -> None:
    """Put `POST /api/v1/client-tokens` in the admin API's OpenAPI document. The proxy serves it (raw ASGI, see
    proxy/minting.py), so no route of the control app declares it: a route declared here, outside the app, is
    added to the document only, and the app still routes nothing there."""
    from fastapi import APIRouter
    from fastapi.openapi.utils import get_openapi

    from credgate.error_responses import ERROR_RESPONSES, ErrorOut

    documented = APIRouter()
    refusals: dict[int | str, dict[str, Any]] = {status: ERROR_RESPONSES[status] for status in (400, 422, 503)}
    for status, description in (
        (401, "missing or invalid project token"),
        (403, "a client token or an end user's token cannot mint"),
        (405, "not POST"),
        (413, "body over 64 KiB"),
    ):
        refusals[status] = {"model": ErrorOut, "description": description}

    @documented.post(
        MINTING_PATH.decode(),
        status_code=201,
        response_model=MintedToken,
        responses=refusals,
        response_description="the client token",
        openapi_extra={"security": [{"HTTPBearer": []}]},  # the admin API's scheme: a bearer token, here the project's
        tags=["client tokens"],
        summary="Mint a client token",
        description="With a **project token** (not an admin token): a short-lived token for a page or an app, "
        "scoped to providers, endpoints and origins within the project's. Served beside the proxy, on the main "
        "listener only.",
    )
    async def mint_client_token(request: MintRequest) -> MintedToken:  # never routed: the proxy answers
        raise NotImplementedError

    def openapi() -> dict[str, Any]:
        if control.openapi_schema is None:
            routes = [*control.routes, *documented.routes]
            control.openapi_schema = get_openapi(title=control.title, version=control.version, routes=routes)
        return control.openapi_schema

    control.openapi = openapi  # type: ignore[method-assign]


async def _gateways_panel(scope: Scope, receive: Receive, send: Send) -> None:
    panel: ASGIApp = scope["state"]["panel"]
    await panel(scope, receive, send)


def create_app(
    settings: Settings,
    *,
    context: Context | None = None,
    upstream_connections: int = 1000,
) -> Gateway:
    """Build the gateway over one Runtime. Given `context`, it is used as it is (tests); otherwise it is opened at
    start and closed at shutdown. The proxy exists once the lifespan has started. `upstream_connections`: the
    proxy's connections to upstreams open at once (in each pool)."""
    runtime = Runtime(settings, open_context, context=context, upstream_connections=upstream_connections)
    return Gateway(runtime, _control_app)
