"""The bare reference proxy: the floor a Python gateway cannot go under, measured beside credgate in every run.

    python bench/bare_proxy.py PORT UPSTREAM_URL TOKEN KEY [WORKERS]

uvicorn with uvloop and httptools, a raw ASGI app, one aiohttp session: the project token is looked up in a dict,
`Authorization` is swapped for the provider key, the request body is streamed up and the response streamed back.
No limits, no log, no usage record, no request id: everything credgate adds is measured against this. With
WORKERS, that many processes share one listening socket through uvicorn's supervisor (credgate's workers have a
socket each, see README, Several workers): what a second core gives a proxy that does nothing else.
"""

import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import uvicorn
from starlette.types import Message, Receive, Scope, Send

PREFIX = b"/proxy/openai/"
DROPPED = {b"host", b"authorization", b"content-length", b"transfer-encoding", b"connection"}
RESPONSE_DROPPED = {"transfer-encoding", "connection", "keep-alive"}


class BareProxy:
    def __init__(self, upstream: str, token: str, key: str) -> None:
        self.upstream = upstream.rstrip("/") + "/"
        self.keys = {f"Bearer {token}".encode(): f"Bearer {key}"}
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        await self.forward(scope, receive, send, dict(scope["headers"]))

    async def forward(self, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, bytes]) -> None:
        """The request, its `headers` read once, relayed with the key in place of the token (401 for another)."""
        key = self.keys.get(headers.get(b"authorization", b""))
        path: bytes = scope["raw_path"]
        if key is None or not path.startswith(PREFIX) or self.session is None:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        upstream_headers = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in headers.items() if name not in DROPPED
        }
        upstream_headers["Authorization"] = key
        length = headers.get(b"content-length")
        if length is not None:
            upstream_headers["Content-Length"] = length.decode()
        has_body = length is not None or b"transfer-encoding" in headers

        async def body() -> AsyncIterator[bytes]:
            more = True
            while more:
                message: Message = await receive()
                more = message.get("more_body", False)
                yield message.get("body", b"")

        url = self.upstream + path[len(PREFIX) :].decode("latin-1")
        async with self.session.request(
            scope["method"], url, headers=upstream_headers, data=body() if has_body else None
        ) as response:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": [
                        (name, value)
                        for name, value in response.raw_headers
                        if name.decode("latin-1").lower() not in RESPONSE_DROPPED
                    ],
                }
            )
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


ARGUMENTS = "REFERENCE_PROXY_ARGUMENTS"  # where a spawned worker finds its proxy's arguments


def arguments() -> list[str]:
    return os.environ[ARGUMENTS].split(" ")


def app() -> BareProxy:
    """The proxy of a worker process (spawned: it reads its arguments from the environment)."""
    return BareProxy(*arguments())


def serve(app: "BareProxy | str", port: int, **options: Any) -> None:
    """uvicorn as the reference proxies run it: uvloop, httptools, nothing logged or added to a response."""
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        log_level="warning",
        **options,
    )


def serve_command_line(module: str, make: Callable[[], BareProxy], count: int) -> None:
    """`python MODULE.py PORT ARGUMENT… [WORKERS]`, with `count` arguments: one process serves `make()`; with WORKERS,
    uvicorn's supervisor spawns that many, and each builds its proxy by `MODULE:app`."""
    port, given = int(sys.argv[1]), sys.argv[2 : 2 + count]
    workers = int(sys.argv[2 + count]) if len(sys.argv) > 2 + count else 1
    os.environ[ARGUMENTS] = " ".join(given)
    if workers == 1:
        serve(make(), port)
    else:
        here = os.path.dirname(os.path.abspath(__file__))
        serve(f"{module}:app", port, factory=True, workers=workers, app_dir=here)


if __name__ == "__main__":
    serve_command_line("bare_proxy", app, 3)
