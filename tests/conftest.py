"""Shared fixtures: every test gets its own database, SQLite always and PostgreSQL when one is configured.

Set CREDGATE_TEST_POSTGRES_URL (e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/test) to run the
PostgreSQL half; each test then gets a schema of its own (one an earlier test of the process used, emptied, when
it can). CREDGATE_TEST_REQUIRE_POSTGRES=1 (set by .ci/run) turns the skip into a failure, so CI never hides the gap.
"""

import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from credgate.app import create_app
from credgate.config import Settings
from credgate.log_format import quiet_chatty_loggers
from credgate.services import admins
from credgate.services.bootstrap import open_context
from credgate.services.context import Context
from tests.migrated_template import PostgresSchemas, lay_in_migrated_schema
from tests.secret_sweep import SWEEP, SweepHandler

pytest_plugins = ["tests.teardown_guard"]

POSTGRES_URL = os.environ.get("CREDGATE_TEST_POSTGRES_URL")
REQUIRE_POSTGRES = os.environ.get("CREDGATE_TEST_REQUIRE_POSTGRES") == "1"
# SDKs that look for cloud credentials (boto3, google-auth) must never ask a metadata server or read the
# machine's own credentials: the tests reach loopback only.
os.environ |= {
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
}


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CREDGATE_* setting of the machine leaks into a test."""
    for name in list(os.environ):
        if name.startswith("CREDGATE_") and not name.startswith("CREDGATE_TEST_"):
            monkeypatch.delenv(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "postgresql" and not POSTGRES_URL:
        if REQUIRE_POSTGRES:
            pytest.fail("CREDGATE_TEST_REQUIRE_POSTGRES=1 but CREDGATE_TEST_POSTGRES_URL is not set")
        pytest.skip("PostgreSQL tests need CREDGATE_TEST_POSTGRES_URL (the README's test command sets it)")
    return str(request.param)


# For tests of what is refused before any query (a field's validation): the database cannot change the answer,
# so they run on SQLite only; everything that stores or reads runs on both.
ONE_DATABASE = pytest.mark.parametrize("backend", ["sqlite"])


@pytest.fixture(scope="session")
def postgres_schemas() -> Iterator[PostgresSchemas | None]:
    if not POSTGRES_URL:
        yield None
        return
    schemas = PostgresSchemas(POSTGRES_URL)
    yield schemas
    schemas.close()


@pytest.fixture
async def database(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, postgres_schemas: PostgresSchemas | None
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A database URL and connect arguments private to this test. For a test that opens `ctx` a PostgreSQL schema
    comes with the migrated template in (`ctx` lays it into a SQLite file itself); otherwise it is empty."""
    if backend == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'credgate.db'}", {}
        return
    assert POSTGRES_URL is not None
    assert postgres_schemas is not None
    schema = await postgres_schemas.take(migrated="ctx" in request.fixturenames)
    try:
        yield POSTGRES_URL, {"server_settings": {"search_path": schema}}
    finally:
        await postgres_schemas.give_back(schema)


@pytest.fixture
def settings(database: tuple[str, dict[str, Any]], tmp_path: Path) -> Settings:
    # The stand-in upstreams listen on loopback; tests of the SSRF guard turn this off.
    return Settings(data_dir=tmp_path / "data", database_url=database[0], allow_private_upstreams=True)


@pytest.fixture
async def ctx(settings: Settings, database: tuple[str, dict[str, Any]]) -> AsyncIterator[Context]:
    if database[0].startswith("sqlite"):  # a PostgreSQL `database` has it already
        await lay_in_migrated_schema(*database)  # the migrations' result without running them per test
    context = await open_context(settings, connect_args=database[1])
    try:
        yield context
    finally:
        await context.database.dispose()
        if database[0].startswith("sqlite"):
            database_file = Path(database[0].split("///", 1)[1])
            for path in (database_file, database_file.with_name(database_file.name + "-wal")):
                SWEEP.scan_file(path, SWEEP.secrets)


@pytest.fixture
async def admin_token(ctx: Context) -> str:
    return await admins.create_admin_token(ctx, name="tests", actor="tests")


@pytest.fixture
async def client(settings: Settings, ctx: Context, admin_token: str) -> AsyncIterator[httpx.AsyncClient]:
    """The admin API in process, signed in with an admin token."""
    transport = httpx.ASGITransport(app=create_app(settings, context=ctx))
    headers = {"Authorization": f"Bearer {admin_token}"}
    hooks: dict[str, list[Callable[..., Any]]] = {"request": [_sweep_request], "response": [_sweep_response]}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://credgate.test", headers=headers, event_hooks=hooks
    ) as client:
        yield client


async def _sweep_request(request: httpx.Request) -> None:
    SWEEP.register_request_body(request.content)


async def _sweep_response(response: httpx.Response) -> None:
    await response.aread()
    where = f"response {response.request.method} {response.request.url.path}"
    SWEEP.capture(where, "\n".join(f"{name}: {value}" for name, value in response.headers.items()) + response.text)


@pytest.fixture
def anonymous(client: httpx.AsyncClient) -> Iterator[httpx.AsyncClient]:
    """The same in-process API without the admin token."""
    token = client.headers.pop("Authorization")
    yield client
    client.headers["Authorization"] = token


def pytest_sessionstart(session: pytest.Session) -> None:
    root = logging.getLogger()
    root.addHandler(SweepHandler(SWEEP))
    root.setLevel(logging.DEBUG)  # the sweep reads DEBUG records too
    quiet_chatty_loggers(logging.DEBUG)  # as a gateway at DEBUG: what its log could hold is what the sweep reads


# What each pytest-xdist worker's sweep found, gathered by the controller, which reports for the whole run.
_WORKER_SWEEPS: list[dict[str, Any]] = []


def pytest_testnodedown(node: Any, error: object) -> None:
    sweep = getattr(node, "workeroutput", {}).get("sweep")
    if sweep is not None:
        _WORKER_SWEEPS.append(sweep)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run on a leaked secret; with CREDGATE_TEST_NO_SKIPS=1 (CI), on any skip too."""
    own = {"leaks": SWEEP.findings(), "secrets": len(SWEEP.secrets), "texts": len(SWEEP.texts)}
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its controller reports for every worker
        workeroutput["sweep"] = own
        return
    sweeps = [own, *_WORKER_SWEEPS]
    leaks = [leak for sweep in sweeps for leak in sweep["leaks"]]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if leaks:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter is not None:
            reporter.write_line(f"error: stored secrets leaked ({len(leaks)}): {leaks[:10]}", red=True)
    elif reporter is not None:
        secrets_searched = sum(sweep["secrets"] for sweep in sweeps)
        texts_searched = sum(sweep["texts"] for sweep in sweeps)
        reporter.write_line(
            f"secret sweep: {secrets_searched} provider keys searched in {texts_searched} responses and log "
            "records, none found"
        )
    skipped = len(reporter.stats.get("skipped", [])) if reporter is not None else 0
    if os.environ.get("CREDGATE_TEST_NO_SKIPS") == "1" and skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter is not None:
            reporter.write_line(f"error: {skipped} tests skipped, and CREDGATE_TEST_NO_SKIPS=1 forbids skips", red=True)
