"""A real deployment: three `credgate serve --workers 2` instances on one PostgreSQL database and one Redis, behind
Debian's nginx with the configuration shipped in docs/deploy/nginx.conf.

PostgreSQL is reached through a fault relay (tests/upstream.py), so that a test can take it away from every
instance at once and give it back; Redis is a private redis-server a test may stop. Change polling is set to one
second, so anything faster than that came through Redis.
"""

import asyncio
import contextlib
import itertools
import logging
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from credgate.config import Settings
from credgate.crypto import encode_master_key, new_master_key
from credgate.services import admins, budgets, projects
from credgate.services.bootstrap import open_context
from tests.admin_ui.test_pages import shown_token
from tests.admin_ui.test_security import PASSWORD, csrf_of
from tests.conftest import POSTGRES_URL, REQUIRE_POSTGRES
from tests.e2e.conftest import CREDGATE, Project, add_custom, free_port
from tests.redis_server import REQUIRE_REDIS, PrivateRedis
from tests.secret_sweep import SWEEP
from tests.upstream import FaultRelay, Upstream, run_fault_relay

# One pytest-xdist worker runs this module, so the fleet below starts once per run, not once per worker.
pytestmark = pytest.mark.xdist_group("fleet")
INSTANCES = 3
WORKERS = 2
POLL_SECONDS = 1.0
STARTUP_SECONDS = 90
NGINX = "/usr/sbin/nginx"
NGINX_CONF = Path(__file__).parents[2] / "docs" / "deploy" / "nginx.conf"
FAIL_TIMEOUT_SECONDS = 5  # its fail_timeout: how long nginx leaves out an instance that refused a connection
# The measurements, for `pytest tests/e2e/test_fleet.py -o log_cli=true --log-cli-level=INFO`.
logger = logging.getLogger(__name__)


def require_parts() -> str:
    """The PostgreSQL server URL; the test skips (in CI: fails) without PostgreSQL, redis-server or nginx."""
    missing = [
        what
        for what, present in [
            ("CREDGATE_TEST_POSTGRES_URL", bool(POSTGRES_URL)),
            ("Debian's redis-server", shutil.which("redis-server") is not None),
            ("Debian's nginx", Path(NGINX).exists()),
        ]
        if not present
    ]
    if missing:
        message = f"the fleet tests need {', '.join(missing)}"
        if REQUIRE_POSTGRES or REQUIRE_REDIS:
            pytest.fail(message)
        pytest.skip(message)
    assert POSTGRES_URL is not None
    return POSTGRES_URL


class ThreadedRelay:
    """The fault relay in front of PostgreSQL, on an event loop of its own: it outlives every test's loop."""

    def __init__(self, host: str, port: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.relay: FaultRelay | None = None
        self._thread = threading.Thread(target=self._run, args=(host, port), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self, host: str, port: int) -> None:
        async def serve() -> None:
            self._stop = asyncio.Event()
            async with run_fault_relay(host, port) as relay:
                self.relay = relay
                self._ready.set()
                await self._stop.wait()

        try:
            self._loop.run_until_complete(serve())
        finally:
            self._loop.close()

    @property
    def port(self) -> int:
        assert self.relay is not None
        return self.relay.port

    def _call(self, action: str) -> None:
        assert self.relay is not None
        self._loop.call_soon_threadsafe(getattr(self.relay, action))

    def refuse(self) -> None:
        self._call("refuse")

    def restore(self) -> None:
        self._call("restore")

    def close(self) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@dataclass
class Instance:
    port: int
    log: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(
                [CREDGATE, "serve", "--port", str(self.port), "--workers", str(WORKERS)],
                stdout=output,
                stderr=subprocess.STDOUT,
                env=self.env,
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        with httpx.Client(timeout=1) as probe:
            while time.monotonic() < deadline:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise RuntimeError(f"an instance exited with {self.process.returncode}: {self.log.read_text()}")
                with contextlib.suppress(httpx.TransportError):
                    if probe.get(f"{self.url}/readyz").status_code == 200:
                        return
                time.sleep(0.05)
        raise RuntimeError(f"an instance did not become ready: {self.log.read_text()}")

    async def served_by(self, response: httpx.Response) -> int:
        """The pid of the worker whose access line carries the response's request id."""
        line = re.compile(rf"\[(\d+)\] INFO credgate\.access: .* {response.headers['x-credgate-request-id']}$", re.M)
        for _ in range(100):
            if found := line.search(self.log.read_text(errors="replace")):
                return int(found.group(1))
            await asyncio.sleep(0.02)
        raise AssertionError("no access line for the response")

    async def warm(self, client: httpx.AsyncClient, path: str) -> None:
        """Requests on new connections until every worker of this instance has served (and cached) the token.
        The workers share one listening socket and the first to accept takes a connection: on a loaded machine
        one may take many in a row, so the requests go on (spaced) for up to 30 s."""
        served = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            response = await client.get(f"{self.url}{path}")
            assert response.status_code == 200
            served.add(await self.served_by(response))
            if len(served) == WORKERS:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"30 s of requests reached only workers {served}")

    def terminate(self) -> int:
        self.signal_stop()
        return self.wait_stopped()

    def signal_stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout=60)
        finally:
            self.process = None


@dataclass
class Fleet:
    balancer: str
    instances: list[Instance]
    settings: Settings
    relay: ThreadedRelay
    redis: PrivateRedis

    def logs(self) -> str:
        return "".join(instance.log.read_text(errors="replace") for instance in self.instances)


def _nginx_config(directory: Path, listen: int, instances: list[Instance]) -> Path:
    site = NGINX_CONF.read_text()
    servers = "".join(f"    server 127.0.0.1:{i.port} max_fails=1 fail_timeout=5s;\n" for i in instances)
    site = re.sub(r"(?m)^    server 10\.0\.0\.\d+:8080 .*\n", "", site, count=INSTANCES)
    site = site.replace("upstream credgate {\n", "upstream credgate {\n" + servers, 1)
    site = site.replace("listen 80;", f"listen 127.0.0.1:{listen};")
    (directory / "site.conf").write_text(site)
    main = directory / "nginx.conf"
    main.write_text(
        f"daemon off;\npid {directory}/nginx.pid;\nerror_log {directory}/error.log warn;\n"
        "events { worker_connections 1024; }\n"
        f"http {{\n  access_log off;\n  client_body_temp_path {directory}/body;\n"
        f"  proxy_temp_path {directory}/proxy;\n  include {directory}/site.conf;\n}}\n"
    )
    return main


@contextlib.contextmanager
def _database(server_url: str) -> Iterator[str]:
    """A database of its own on the PostgreSQL server, dropped afterwards."""
    name = f"credgate_fleet_{secrets.token_hex(6)}"
    url = make_url(server_url)

    async def run(statement: str) -> None:
        engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
        try:
            async with engine.connect() as connection:
                await connection.execute(text(statement))
        finally:
            await engine.dispose()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    server_url = require_parts()
    root = tmp_path_factory.mktemp("fleet")
    with _database(server_url) as database_url:
        target = make_url(database_url)
        relay = ThreadedRelay(target.host or "127.0.0.1", target.port or 5432)
        redis = PrivateRedis(root)
        redis.start()
        through = target.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
        master_key = encode_master_key(new_master_key())
        SWEEP.register(master_key)
        common = {
            "CREDGATE_DATABASE_URL": through,
            "CREDGATE_REDIS_URL": redis.url,
            "CREDGATE_MASTER_KEY": master_key,
            "CREDGATE_CHANGE_POLL_SECONDS": str(POLL_SECONDS),
            "CREDGATE_STALE_SECONDS": "3",
            "CREDGATE_DRAIN_SECONDS": "20",
            "CREDGATE_ALLOW_PRIVATE_UPSTREAMS": "true",  # the stand-in upstream is on loopback
        }
        base_env = {name: value for name, value in os.environ.items() if not name.startswith("CREDGATE_")}
        instances = []
        for number in range(INSTANCES):
            data_dir = root / f"instance{number}"
            env = {**base_env, **common, "CREDGATE_DATA_DIR": str(data_dir)}
            instances.append(Instance(free_port(), root / f"instance{number}.log", env))
        instances[0].start()  # the first migrates; the others then find the schema at its head
        instances[0].wait_ready()
        for instance in instances[1:]:
            instance.start()
        for instance in instances[1:]:
            instance.wait_ready()
        listen = free_port()
        with (root / "nginx.out").open("wb") as output:
            nginx = subprocess.Popen([NGINX, "-c", str(_nginx_config(root, listen, instances))], stderr=output)
        balancer = f"http://127.0.0.1:{listen}"
        with httpx.Client(timeout=1) as probe:
            for _ in range(200):
                with contextlib.suppress(httpx.TransportError):
                    if probe.get(f"{balancer}/healthz").status_code == 200:
                        break
                time.sleep(0.05)
        settings = Settings(
            data_dir=root / "admin",
            database_url=database_url,
            redis_url=redis.url,
            master_key=master_key,
            allow_private_upstreams=True,
        )
        running = Fleet(balancer, instances, settings, relay, redis)
        try:
            yield running
        finally:
            nginx.terminate()
            nginx.wait(10)
            running_instances = [instance for instance in instances if instance.process is not None]
            for instance in running_instances:  # all told at once, so that their drains overlap
                instance.signal_stop()
            try:
                for instance in running_instances:
                    instance.wait_stopped()
            finally:
                SWEEP.capture("fleet logs", running.logs())
                redis.stop()
                relay.close()


async def add_project(
    fleet: Fleet,
    upstream: Upstream,
    *,
    rate_limit: int | None = None,
    budget: int | None = None,
    max_concurrent: int | None = None,
) -> tuple[Project, str]:
    """A project with a stand-in integration allowing everything, and an admin token, made beside the fleet
    (through a context of its own on the same database and Redis, as the CLI would)."""
    ctx = await open_context(fleet.settings)
    try:
        created, token = await projects.create_project(ctx, name="fleet", actor="t")
        project = Project(created.id, token, "")
        await add_custom(ctx, project, "stand-in", upstream.url)
        if rate_limit is not None or max_concurrent is not None:
            changes = projects.ProjectChanges(rate_limit_per_minute=rate_limit, max_concurrent_requests=max_concurrent)
            await projects.update_project(ctx, project_id=created.id, changes=changes, actor="t")
        if budget is not None:
            await budgets.add_budget(
                ctx, project_id=created.id, metric="requests", limit=budget, period="day", actor="t"
            )
        return project, await admins.create_admin_token(ctx, name=f"fleet-{secrets.token_hex(3)}", actor="t")
    finally:
        await ctx.close()


def fresh_client(token: str) -> httpx.AsyncClient:
    """A client of `token` with every request on a connection of its own: round-robin spreads them."""
    headers = {"connection": "close", "authorization": f"Bearer {token}"}
    return httpx.AsyncClient(headers=headers, limits=httpx.Limits(max_keepalive_connections=0), timeout=30)


async def test_a_revocation_through_one_instance_is_refused_by_every_instance_within_100_ms(
    fleet: Fleet, upstream: Upstream
) -> None:
    """Measured 20 times: from the revocation's answer to the last request an instance still let through."""
    delays = []
    for trial in range(20):
        project, admin_token = await add_project(fleet, upstream)
        proxy = "/proxy/stand-in/echo/revoked"
        async with fresh_client(project.token) as client:
            for instance in fleet.instances:  # the token cached as valid on every worker
                await instance.warm(client, proxy)
            revoking = fleet.instances[trial % INSTANCES]
            # What is measured starts at the answer; a worker's first admin request loads the admin API, which took
            # over httpx's default 5 s on a slow host.
            async with httpx.AsyncClient(headers={"authorization": f"Bearer {admin_token}"}, timeout=30) as admin:
                revoked = await admin.delete(f"{revoking.url}/api/v1/projects/{project.id}/token")
            assert revoked.status_code == 204
            answered = time.perf_counter()

            async def until_refused(instance: Instance, proxy: str = proxy, answered: float = answered) -> float:
                """How long after the answer a request the instance still served was sent (0: none), once each of
                its workers has refused it. Sent, not answered: on a loaded host an answer can take longer to come
                back than the change took to reach the instance."""
                last_served, refused_by = answered, set[int]()
                while len(refused_by) < WORKERS:
                    sent = time.perf_counter()
                    response = await client.get(f"{instance.url}{proxy}")
                    if response.status_code == 200:
                        last_served = sent
                        assert last_served - answered < 1, "served for a second after the revocation"
                    else:
                        assert response.status_code == 401
                        refused_by.add(await instance.served_by(response))
                return last_served - answered

            delays += await asyncio.gather(*(until_refused(instance) for instance in fleet.instances))
    p50, p99 = statistics.median(delays), statistics.quantiles(delays, n=100)[98]
    logger.info(
        "revocation propagation over %d instance-trials: p50 %.1f ms, p99 %.1f ms", len(delays), p50 * 1e3, p99 * 1e3
    )
    assert max(delays) < 0.1, f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {max(delays) * 1000:.1f} ms"


async def test_a_limit_of_n_per_minute_admits_n_across_every_instance_under_concurrent_load(
    fleet: Fleet, upstream: Upstream
) -> None:
    """Five limits, each hit by four times as many requests at once, spread over every worker by nginx."""
    for limit in (10, 20, 30, 50, 80):
        project, _ = await add_project(fleet, upstream, rate_limit=limit)
        async with fresh_client(project.token) as client:
            started = time.monotonic()
            answers = await asyncio.gather(
                *(client.get(f"{fleet.balancer}/proxy/stand-in/echo/limited") for _ in range(limit * 4))
            )
            elapsed = time.monotonic() - started
        statuses = [answer.status_code for answer in answers]
        assert set(statuses) <= {200, 429}
        admitted = statuses.count(200)
        # Exact in Redis; the only slack is the refill while the burst lasted (one request every 60/limit s).
        refilled = int(elapsed / (60 / limit)) + 1
        logger.info("limit %d/min: %d admitted of %d in %.2f s", limit, admitted, len(statuses), elapsed)
        assert limit <= admitted <= limit + refilled
        assert all(answer.headers.get("retry-after") for answer in answers if answer.status_code == 429)


async def test_a_budget_of_50_admits_exactly_50_of_200_concurrent_requests_across_every_instance(
    fleet: Fleet, upstream: Upstream
) -> None:
    project, _ = await add_project(fleet, upstream, budget=50)
    async with fresh_client(project.token) as client:
        answers = await asyncio.gather(
            *(client.get(f"{fleet.balancer}/proxy/stand-in/echo/budget") for _ in range(200))
        )
    statuses = [answer.status_code for answer in answers]
    assert (statuses.count(200), statuses.count(402)) == (50, 150)  # counted once, in Redis: no slack


async def test_a_cap_of_6_requests_under_way_holds_across_every_instance_and_frees_as_they_end(
    fleet: Fleet, upstream: Upstream
) -> None:
    project, _ = await add_project(fleet, upstream, max_concurrent=6)
    async with fresh_client(project.token) as client:
        slow = f"{fleet.balancer}/proxy/stand-in/slow?seconds=3"
        answers = await asyncio.gather(*(client.get(slow) for _ in range(24)))
        statuses = [answer.status_code for answer in answers]
        assert (statuses.count(200), statuses.count(429)) == (6, 18)  # counted once, in Redis: no slack
        assert all(answer.headers["retry-after"] == "1" for answer in answers if answer.status_code == 429)
        # Every place was given back, whichever instance held it: six at once again.
        again = await asyncio.gather(*(client.get(f"{fleet.balancer}/proxy/stand-in/slow?seconds=1") for _ in range(6)))
        assert [answer.status_code for answer in again] == [200] * 6


async def mint(fleet: Fleet, project: Project, subject: str) -> str:
    async with fresh_client(project.token) as minting:  # through the balancer: whichever instance
        answer = await minting.post(f"{fleet.balancer}/api/v1/client-tokens", json={"subject": subject})
    token: str = answer.json()["token"]
    return token


async def test_end_users_are_counted_once_across_every_instance_whichever_minted_their_tokens(
    fleet: Fleet, upstream: Upstream
) -> None:
    """Client tokens minted through any instance work on every one; an end user's rate limit (20 a minute, one
    project) and per-end-user budget (10 a day, another) are each counted once, in Redis."""
    limited, _ = await add_project(fleet, upstream)
    budgeted, _ = await add_project(fleet, upstream)
    ctx = await open_context(fleet.settings)
    try:
        changes = projects.ProjectChanges(subject_rate_limit_per_minute=20)
        await projects.update_project(ctx, project_id=limited.id, changes=changes, actor="t")
        await budgets.add_budget(
            ctx, project_id=budgeted.id, metric="requests", limit=10, period="day", per_subject=True, actor="t"
        )
    finally:
        await ctx.close()

    async def burst(token: str, count: int) -> list[int]:
        async with fresh_client(token) as client:
            answers = await asyncio.gather(
                *(client.get(f"{fleet.balancer}/proxy/stand-in/echo/user") for _ in range(count))
            )
        return [answer.status_code for answer in answers]

    started = time.monotonic()
    statuses = await burst(await mint(fleet, limited, "alice"), 80)
    refilled = int((time.monotonic() - started) / 3) + 1  # 20 a minute refills one every 3 s
    assert set(statuses) <= {200, 429}
    assert 20 <= statuses.count(200) <= 20 + refilled
    assert (await burst(await mint(fleet, limited, "bob"), 15)) == [200] * 15  # a count of bob's own

    statuses = await burst(await mint(fleet, budgeted, "carol"), 40)
    assert (statuses.count(200), statuses.count(402)) == (10, 30)
    dave = await mint(fleet, budgeted, "dave")
    for instance in fleet.instances:  # each instance checks a token minted elsewhere alone
        async with fresh_client(dave) as client:
            assert (await client.get(f"{instance.url}/proxy/stand-in/echo/user")).status_code == 200


async def test_redis_stopped_under_load_fails_no_request_and_its_return_brings_sharing_back(
    fleet: Fleet, upstream: Upstream
) -> None:
    project, admin_token = await add_project(fleet, upstream, rate_limit=1_000_000)
    statuses: list[int] = []
    async with fresh_client(project.token) as client:

        async def load(seconds: float) -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                statuses.append((await client.get(f"{fleet.balancer}/proxy/stand-in/echo/load")).status_code)

        async def stop_and_start() -> None:
            await asyncio.sleep(0.5)
            fleet.redis.stop()
            await asyncio.sleep(1.5)
            fleet.redis.start()

        await asyncio.gather(*(load(4) for _ in range(8)), stop_and_start())
    assert statuses.count(200) == len(statuses), {status: statuses.count(status) for status in set(statuses)}
    assert len(statuses) > 50

    # Back: a change made through one instance reaches the others through Redis again (faster than the poll).
    await asyncio.sleep(1.5)  # the followers retry every second
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {admin_token}"}, timeout=30) as admin:
        assert (await admin.delete(f"{fleet.instances[0].url}/api/v1/projects/{project.id}/token")).status_code == 204
    async with fresh_client(project.token) as client:
        await asyncio.sleep(0.1)
        refused = [(await client.get(f"{i.url}/proxy/stand-in/echo/x")).status_code for i in fleet.instances * 2]
    assert set(refused) == {401}
    assert "Redis does not answer" in fleet.logs()


async def test_postgresql_gone_is_served_stale_then_503_and_everything_resumes_when_it_is_back(
    fleet: Fleet, upstream: Upstream
) -> None:
    project, admin_token = await add_project(fleet, upstream)
    async with fresh_client(project.token) as client:
        for instance in fleet.instances:
            await instance.warm(client, "/proxy/stand-in/echo/warm")
        fleet.relay.refuse()
        gone = time.monotonic()
        try:
            stale = [(await client.get(f"{fleet.balancer}/proxy/stand-in/echo/stale")).status_code for _ in range(6)]
            ready = [(await client.get(f"{i.url}/readyz")).status_code for i in fleet.instances]
            async with httpx.AsyncClient(headers={"authorization": f"Bearer {admin_token}"}, timeout=30) as admin:
                write = await admin.post(f"{fleet.balancer}/api/v1/projects", json={"name": "while-down"})
            await asyncio.sleep(max(0.0, gone + 3 + 2 * POLL_SECONDS + 1 - time.monotonic()))  # past the stale bound
            after = [(await client.get(f"{fleet.balancer}/proxy/stand-in/echo/late")).status_code for _ in range(6)]
        finally:
            fleet.relay.restore()
        assert stale == [200] * 6  # within CREDGATE_STALE_SECONDS (3 s here)
        assert ready == [503] * INSTANCES
        assert write.status_code == 503
        assert after == [503] * 6
        deadline = time.monotonic() + 15
        while (await client.get(f"{fleet.balancer}/proxy/stand-in/echo/back")).status_code != 200:
            assert time.monotonic() < deadline, "not serving within 15 s of the database's return"
            await asyncio.sleep(0.2)
        back = [(await client.get(f"{i.url}/proxy/stand-in/echo/back")).status_code for i in fleet.instances * 2]
        assert back == [200] * INSTANCES * 2


async def test_an_instance_stopped_mid_stream_finishes_the_stream_and_a_rolling_restart_fails_no_request(
    fleet: Fleet, upstream: Upstream
) -> None:
    project, _ = await add_project(fleet, upstream)
    bearer = {"authorization": f"Bearer {project.token}"}
    statuses: list[int] = []
    restarting = asyncio.Event()

    async def load(client: httpx.AsyncClient) -> None:
        while not restarting.is_set():
            statuses.append((await client.get(f"{fleet.balancer}/proxy/stand-in/echo/rolling")).status_code)

    async def roll(client: httpx.AsyncClient) -> list[bytes]:
        streams = []
        for instance in fleet.instances:
            async with client.stream("GET", f"{instance.url}/proxy/stand-in/sse?delay=0.2&n=10") as stream:
                chunks = stream.aiter_bytes()
                first = await anext(chunks)
                exit_code = asyncio.ensure_future(asyncio.to_thread(instance.terminate))
                streams.append(first + b"".join([chunk async for chunk in chunks]))
                assert await exit_code == 0
            await asyncio.to_thread(instance.start)
            await asyncio.to_thread(instance.wait_ready)
            if instance is not fleet.instances[-1]:  # as docs/deploy.md says: nginx's fail_timeout before the next
                await asyncio.sleep(FAIL_TIMEOUT_SECONDS)
        restarting.set()
        return streams

    async with fresh_client(project.token) as client, httpx.AsyncClient(headers=bearer, timeout=60) as streaming:
        loads = [asyncio.ensure_future(load(client)) for _ in range(4)]
        streams = await roll(streaming)
        await asyncio.gather(*loads)
    assert statuses.count(200) == len(statuses), {status: statuses.count(status) for status in set(statuses)}
    for body in streams:
        assert body.count(b"data: ") == 10, body  # every event, the stream completed while its instance drained


async def test_the_panels_add_new_api_flow_works_with_every_step_on_another_instance(fleet: Fleet) -> None:
    key = "sk-test-fleet-panel-key-0000wxyz"
    SWEEP.register(key)
    username = f"admin-{secrets.token_hex(3)}"
    ctx = await open_context(fleet.settings)
    try:
        await admins.create_admin_user(ctx, username=username, password=PASSWORD, actor="t")
    finally:
        await ctx.close()
    steps: list[int] = []

    async def step(response: httpx.Response) -> httpx.Response:
        request_id = response.headers["x-credgate-request-id"]
        for _ in range(100):
            found = [n for n, i in enumerate(fleet.instances) if request_id in i.log.read_text(errors="replace")]
            if found:
                steps.append(found[0])
                return response
            await asyncio.sleep(0.02)
        raise AssertionError("no instance logged the request")

    limits = httpx.Limits(max_keepalive_connections=0)
    # As a browser posts its forms: with an Origin, which the panel checks against the Host nginx passes on.
    browsing = {"connection": "close", "origin": fleet.balancer}
    async with httpx.AsyncClient(base_url=fleet.balancer, headers=browsing, limits=limits) as browser:
        form = await step(await browser.get("/admin/login"))
        signed_in = await step(
            await browser.post(
                "/admin/login", data={"csrf": csrf_of(form.text), "username": username, "password": PASSWORD}
            )
        )
        assert signed_in.status_code == 303
        csrf = csrf_of((await step(await browser.get("/admin/projects"))).text)
        created = await step(await browser.post("/admin/projects", data={"csrf": csrf, "name": "through nginx"}))
        project = created.headers["location"]
        token = shown_token((await step(await browser.get(project))).text)
        assert token is not None
        assert token.startswith("cgp_")
        SWEEP.register(token)
        choose = await step(await browser.get(f"{project}/add?provider=openai"))
        assert 'name="api_key"' in choose.text
        template = {"provider": "openai", "name": "openai", "template": "openai-chat-completions", "api_key": key}
        entered = await step(await browser.post(f"{project}/add", data={"csrf": csrf, **template}))
        assert entered.headers["location"] == f"{project}/add/review"
        review = await step(await browser.get(f"{project}/add/review"))
        assert "…wxyz" in review.text
        saved = await step(await browser.post(f"{project}/add/review", data={"csrf": csrf}))
        assert saved.headers["location"] == project
        shown = await step(await browser.get(project))
        assert "openai set up." in shown.text
        assert key not in shown.text
    assert all(before != after for before, after in itertools.pairwise(steps)), steps
    # Every instance, unless nginx still leaves one out after a test restarted it (for `fail_timeout`).
    assert len(set(steps)) >= INSTANCES - 1
