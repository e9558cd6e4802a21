"""The bare reference proxy with credgate's per-request features added in their plainest cheap form: what those
features cost any Python proxy, measured beside credgate in every run (bench/run.py).

    python bench/floor_proxy.py PORT UPSTREAM_URL TOKEN KEY DATABASE [WORKERS]

On top of bench/bare_proxy.py, for each request: a request id (generated, sent back in `X-Request-Id`); the token
looked up by its SHA-256 (a gateway stores no token in clear); the endpoint checked against an allow-list; a row in
a SQLite request log (WAL, the same columns and indexes as credgate's), its usage read from the JSON response and
the rows of each 0.1 s written in one `executemany` from a thread; an access line and the Prometheus counts
(requests by project, provider and status; durations by provider), each turn's lines written at once and its counts
made at its end. No error handling, no limits, no budgets, no configuration: the floor under credgate's
features, not a gateway. With WORKERS, that many processes share the listener (one socket, as bench/bare_proxy.py's
do) and the database, as `credgate serve --workers` shares the database.
"""

import asyncio
import hashlib
import secrets
import sqlite3
import sys
import time
from datetime import UTC, datetime

import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import Message, Receive, Scope, Send

from bare_proxy import PREFIX, BareProxy, arguments, serve_command_line

# A registry of this module's own: a worker imports it twice (as its main module again, and by name for the app).
METRICS = CollectorRegistry()
REQUESTS = Counter("floor_requests", "proxied requests", ["project", "provider", "status"], registry=METRICS)
DURATIONS = Histogram("floor_request_seconds", "proxied request durations", ["provider"], registry=METRICS)
ALLOWED = {("POST", "chat/completions"), ("GET", "sse")}
PROJECT = "bench-project"
PROVIDER = "openai"
SCHEMA = """
CREATE TABLE IF NOT EXISTS request_records (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at DATETIME, project_id VARCHAR(32), request_id VARCHAR(32),
    method VARCHAR(8), provider VARCHAR(64), endpoint VARCHAR(2048), status INTEGER, duration_ms FLOAT,
    request_bytes BIGINT, response_bytes BIGINT, prompt_tokens INTEGER, completion_tokens INTEGER,
    model VARCHAR(200), cost_micros BIGINT, admitted BOOLEAN, subject VARCHAR(200));
CREATE INDEX IF NOT EXISTS ix_project_at ON request_records (project_id, at);
CREATE INDEX IF NOT EXISTS ix_project_subject_at ON request_records (project_id, subject, at);
"""
INSERT = "INSERT INTO request_records VALUES (NULL" + ", ?" * 16 + ")"


class FloorProxy(BareProxy):
    def __init__(self, upstream: str, token: str, key: str, database: str) -> None:
        super().__init__(upstream, token, key)
        self.hashes = {hashlib.sha256(token.encode()).hexdigest(): PROJECT}
        self.database = database
        self.rows: list[tuple[object, ...]] = []
        self.lines: list[str] = []
        self.counts: list[tuple[str, int, float]] = []
        self.writer: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            self.writer = asyncio.get_running_loop().create_task(self.write_rows())  # held: the loop holds it weakly
            await super().__call__(scope, receive, send)
            return
        started, request_id = time.perf_counter(), secrets.token_hex(8)
        headers = dict(scope["headers"])
        project = self.hashes.get(hashlib.sha256(headers.get(b"authorization", b"")[7:]).hexdigest())
        path: bytes = scope["raw_path"]
        endpoint = path[len(PREFIX) :].decode("latin-1")
        if project is None or (scope["method"], endpoint) not in ALLOWED:
            status = 401 if project is None else 403
            await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        status, sent = 0, 0
        head: list[bytes] = []

        async def send_noting(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"].append((b"x-request-id", request_id.encode()))
            else:
                body = message.get("body", b"")
                sent += len(body)
                if len(head) < 16:
                    head.append(body)
            await send(message)

        await self.forward(scope, receive, send_noting, headers)
        duration = time.perf_counter() - started
        try:
            usage = orjson.loads(b"".join(head)).get("usage") or {}
        except orjson.JSONDecodeError:
            usage = {}
        self.rows.append(
            (
                datetime.now(UTC).isoformat(),
                project,
                request_id,
                scope["method"],
                PROVIDER,
                endpoint,
                status,
                round(duration * 1000, 3),
                0,
                sent,
                usage.get("prompt_tokens"),
                usage.get("completion_tokens"),
                None,
                None,
                True,
                None,
            )
        )
        if not self.lines:
            asyncio.get_running_loop().call_soon(self.end_turn)
        self.lines.append(f"{scope['method']} {path.decode('latin-1')} {status} {duration * 1000:.1f}ms {request_id}")
        self.counts.append((project, status, duration))

    def end_turn(self) -> None:
        sys.stderr.write("\n".join(self.lines) + "\n")
        self.lines.clear()
        for project, status, duration in self.counts:
            REQUESTS.labels(project, PROVIDER, str(status)).inc()
            DURATIONS.labels(PROVIDER).observe(duration)
        self.counts.clear()

    async def write_rows(self) -> None:
        connection = sqlite3.connect(self.database, check_same_thread=False, timeout=10)  # other workers write too
        connection.execute("PRAGMA journal_mode=WAL")
        connection.executescript(SCHEMA)

        def write(rows: list[tuple[object, ...]]) -> None:
            with connection:
                connection.executemany(INSERT, rows)

        while True:
            await asyncio.sleep(0.1)
            rows, self.rows = self.rows, []
            if rows:
                await asyncio.to_thread(write, rows)


def app() -> FloorProxy:
    """The proxy of a worker process (spawned: it reads its arguments from the environment)."""
    return FloorProxy(*arguments())


if __name__ == "__main__":
    serve_command_line("floor_proxy", app, 4)
