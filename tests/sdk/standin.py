"""A provider's stand-in for the SDK tests: a real HTTP server answering only at the routes a test gives it."""

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp import web

from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.secret_sweep import SWEEP
from tests.upstream import Received

Handler = Callable[[web.Request, bytes], Awaitable[web.StreamResponse]]


@dataclass
class StandIn:
    """A provider's stand-in: what it received, at which paths, and the requests that hit no route."""

    url: str = ""
    received: list[Received] = field(default_factory=list)
    unrouted: list[str] = field(default_factory=list)

    @property
    def last(self) -> Received:
        return self.received[-1]


@asynccontextmanager
async def run_stand_in(routes: Mapping[tuple[str, str], Handler]) -> AsyncIterator[StandIn]:
    """Serve `routes` ({(method, path pattern in aiohttp syntax): handler}) and nothing else."""
    state = StandIn()

    def recorded(handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in request.raw_headers]
            state.received.append(Received(request.method, request.raw_path, headers, body))
            return await handler(request, body)

        return handle

    @web.middleware
    async def unrouted(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPNotFound:
            state.unrouted.append(f"{request.method} {request.raw_path}")
            return web.json_response({"error": "no such path at this provider"}, status=404)

    app = web.Application(middlewares=[unrouted], client_max_size=64 * 1024 * 1024)
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, recorded(handler))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        await runner.cleanup()


async def connect_template(
    ctx: Context, project: Project, stand_in: StandIn, *, template: str, provider: str | None = None
) -> str:
    """Set the template's provider up in the project, its base URL moved to the stand-in (same path), with a
    fresh key registered with the secret sweep. Returns the key."""
    spec = ctx.templates[template]
    key = f"sk-{spec.provider}-" + secrets.token_urlsafe(18)
    SWEEP.register(key)
    await integrations.add_template_integration(
        ctx,
        project_id=project.id,
        provider=provider or spec.provider,
        template_id=template,
        actor="tests",
        api_key=key,
        base_url=stand_in.url + urlsplit(spec.base_url).path,
    )
    return key


def assert_token_nowhere(stand_in: StandIn, project: Project) -> None:
    """The project token reached the provider in no header, path, query or body."""
    secret = project.token.removeprefix("cgp_")
    for received in stand_in.received:
        assert secret not in repr(received.headers) + received.path_qs + received.body.decode("latin-1")
