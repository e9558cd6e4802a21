"""`credgate serve --workers 2`: real processes on one real port, behaving as one gateway.

Which worker served a request is read from the gateway's log: every line carries its process id, and the access
line ends with the request id the response carries in `x-credgate-request-id`.
"""

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from credgate.config import Settings
from credgate.services import admins, projects
from credgate.services.bootstrap import open_context
from tests.e2e.conftest import CREDGATE, Project, RunningGateway, add_custom, free_port, start_gateway, stop_gateway
from tests.secret_sweep import SWEEP
from tests.upstream import Upstream

# One pytest-xdist worker runs this module, so its module-scoped gateway starts once per run.
pytestmark = pytest.mark.xdist_group("workers")
WORKERS = 2
POLL_SECONDS = 0.2
STARTUP_SECONDS = 60  # a worker imports the whole gateway: slow on a loaded machine
READY = re.compile(r"\[(\d+)\] INFO uvicorn\.error: Application startup complete\.")
FINISHED = re.compile(r"\[(\d+)\] INFO uvicorn\.error: Finished server process")
SETUP_LINK = re.compile(r"/admin/setup\?token=[A-Za-z0-9_-]+")

Send = Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]


class Served:
    """A `credgate serve --workers 2` and the parent's process."""

    def __init__(self, process: subprocess.Popen[bytes], gateway: RunningGateway) -> None:
        self.process = process
        self.gateway = gateway

    @property
    def port(self) -> int:
        return int(self.gateway.url.rsplit(":", 1)[1])

    @property
    def log(self) -> str:
        return self.gateway.log.read_text(errors="replace")

    def ready_workers(self) -> set[int]:
        return {int(pid) for pid in READY.findall(self.log)}

    async def wait_for_workers(self, count: int, *, besides: set[int] | None = None) -> set[int]:
        """The pids of `count` workers that finished starting (other than `besides`), once there are that many."""
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            ready = self.ready_workers() - (besides or set())
            if len(ready) >= count:
                return ready
            assert self.process.poll() is None, self.log
            await asyncio.sleep(0.1)
        raise AssertionError(f"fewer than {count} workers started: {self.log}")

    async def served_by(self, response: httpx.Response) -> int:
        """The pid of the worker whose access line carries the response's request id (written just after it)."""
        request_id = response.headers["x-credgate-request-id"]
        line = re.compile(rf"^\S+ \S+ \[(\d+)\] INFO credgate\.access: .* {request_id}$", re.MULTILINE)
        for _ in range(100):
            if found := line.search(self.log):
                return int(found.group(1))
            await asyncio.sleep(0.02)
        raise AssertionError(f"no access line for request {request_id}")

    async def on_every_worker(self, send: Send, workers: set[int]) -> dict[int, list[httpx.Response]]:
        """Requests, each on a new connection, until every one of `workers` answered one; the answers by worker."""
        by_worker: dict[int, list[httpx.Response]] = {}
        no_reuse = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(headers={"connection": "close"}, limits=no_reuse, timeout=10) as client:
            for _ in range(200):
                response = await send(client)
                by_worker.setdefault(await self.served_by(response), []).append(response)
                if workers <= by_worker.keys():
                    return by_worker
        raise AssertionError(f"200 connections never reached workers {workers - by_worker.keys()}")


def stop(running: Served) -> None:
    """Stop the gateway; its log and database files go through the secret sweep."""
    stop_gateway(running.process, running.gateway)
    for name in ("credgate.db", "credgate.db-wal"):
        SWEEP.scan_file(running.gateway.log.parent / "data" / name, SWEEP.secrets)


def serve(tmp_path: Path, **env: str) -> Served:
    extra = {"CREDGATE_CHANGE_POLL_SECONDS": str(POLL_SECONDS), **env}
    process, gateway = start_gateway(tmp_path / "data", tmp_path / "gateway.log", extra, workers=WORKERS)
    return Served(process, gateway)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One gateway for the tests that neither kill nor stop it."""
    running = serve(tmp_path_factory.mktemp("workers"))
    try:
        yield running
    finally:
        stop(running)


async def add_project(data_dir: Path, upstream: Upstream) -> tuple[Project, str]:
    """A project with a stand-in integration allowing everything, and an admin token: made beside the server."""
    ctx = await open_context(Settings(data_dir=data_dir, allow_private_upstreams=True))
    try:
        created, token = await projects.create_project(ctx, name="workers", actor="t")
        project = Project(created.id, token, "")
        await add_custom(ctx, project, "stand-in", upstream.url)
        return project, await admins.create_admin_token(ctx, name="workers", actor="t")
    finally:
        await ctx.database.dispose()


async def test_requests_land_on_every_worker_and_never_on_the_parent(served: Served) -> None:
    workers = await served.wait_for_workers(WORKERS)

    by_worker = await served.on_every_worker(lambda client: client.get(f"{served.gateway.url}/healthz"), workers)

    assert by_worker.keys() == workers
    assert served.process.pid not in workers
    assert all(response.status_code == 200 for answers in by_worker.values() for response in answers)


async def test_each_worker_accepts_from_a_listening_socket_of_its_own(served: Served) -> None:
    workers = await served.wait_for_workers(WORKERS)
    sockets = {worker: listening_sockets(worker, served.port) for worker in workers}

    assert [len(each) for each in sockets.values()] == [1] * WORKERS, sockets
    assert len(set().union(*sockets.values())) == WORKERS, sockets
    assert listening_sockets(served.process.pid, served.port) == set().union(*sockets.values())  # the parent keeps them


def cores_of(pid: int) -> set[int]:
    """The CPUs that every thread of process `pid` may run on (a worker's database thread among them); fails when
    its threads differ."""
    found = set()
    for thread in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            found.add(frozenset(os.sched_getaffinity(int(thread))))
    (cores,) = found
    return set(cores)


# Pinned to one core or free, a process on a machine of one CPU runs on the same one: nothing to tell apart.
ON_TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning shows only on 2 CPUs or more")


async def test_workers_are_not_pinned_unless_asked(served: Served) -> None:
    workers = await served.wait_for_workers(WORKERS)
    assert [cores_of(worker) for worker in workers] == [os.sched_getaffinity(0)] * WORKERS


@ON_TWO_CORES
async def test_pinned_workers_each_run_on_a_core_of_their_own_and_a_replacement_on_its_predecessors(
    tmp_path: Path,
) -> None:
    cores = sorted(os.sched_getaffinity(0))
    running = serve(tmp_path, CREDGATE_PIN_WORKERS="true")
    try:
        workers = await running.wait_for_workers(WORKERS)
        core_of = {worker: cores_of(worker) for worker in workers}
        parent = cores_of(running.process.pid)
        killed = next(worker for worker, pinned in core_of.items() if pinned == {cores[1]})  # not the first core
        os.kill(killed, signal.SIGKILL)
        (replacement,) = await running.wait_for_workers(1, besides=workers)
        replaced_on = cores_of(replacement)
        running.process.send_signal(signal.SIGHUP)  # every worker replaced, one at a time
        reloaded = await running.wait_for_workers(WORKERS, besides=workers | {replacement})
        reloaded_on = [cores_of(worker) for worker in reloaded]
    finally:
        stop(running)
    each_on_its_core = [{cores[index % len(cores)]} for index in range(WORKERS)]
    assert sorted(core_of.values(), key=min) == each_on_its_core
    assert replaced_on == {cores[1]}
    assert sorted(reloaded_on, key=min) == each_on_its_core
    assert parent == set(cores)  # the supervisor, which serves nothing, stays free


@ON_TWO_CORES
async def test_one_pinned_process_serves_on_the_first_core(tmp_path: Path) -> None:
    extra = {"CREDGATE_PIN_WORKERS": "true"}
    process, gateway = start_gateway(tmp_path / "data", tmp_path / "gateway.log", extra)
    try:
        pinned = cores_of(process.pid)
    finally:
        stop_gateway(process, gateway)
    assert pinned == {min(os.sched_getaffinity(0))}


async def test_connections_opened_at_once_are_spread_over_the_workers(served: Served) -> None:
    """Each worker listens on a socket of its own, and the kernel spreads connections among them by their
    addresses. On one shared socket, whichever worker woke first took a burst whole: of 64, up to 56, once all."""
    workers = await served.wait_for_workers(WORKERS)
    # As wrk and a front proxy's pool open them: all connected before the first request (a connection completes
    # in the kernel, before any worker accepts it).
    burst = [socket.create_connection(("127.0.0.1", served.port), timeout=10) for _ in range(64)]
    try:
        for connection in burst:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nhost: credgate\r\nconnection: close\r\n\r\n")
        answers = [await asyncio.to_thread(read_response, connection) for connection in burst]
    finally:
        for connection in burst:
            connection.close()

    by_worker = Counter([await served.served_by(answer) for answer in answers])
    assert by_worker.keys() == workers
    # Either worker has 16 or more of 64 but once in some 16,000 runs of an even spread.
    assert min(by_worker.values()) >= 16, by_worker


async def test_a_token_revoked_through_one_worker_is_refused_by_every_worker_within_the_poll(
    served: Served, upstream: Upstream
) -> None:
    workers = await served.wait_for_workers(WORKERS)
    project, admin_token = await add_project(served.gateway.log.parent / "data", upstream)
    proxy = f"{served.gateway.url}/proxy/stand-in/echo/hello"

    def call(client: httpx.AsyncClient) -> Awaitable[httpx.Response]:
        return client.get(proxy, headers={"authorization": f"Bearer {project.token}"})

    before = await served.on_every_worker(call, workers)  # every worker has the token cached as valid
    assert {response.status_code for answers in before.values() for response in answers} == {200}
    forwarded = len(upstream.received)

    async with httpx.AsyncClient(headers={"authorization": f"Bearer {admin_token}"}) as admin:
        revoked = await admin.delete(f"{served.gateway.url}/api/v1/projects/{project.id}/token")
    assert revoked.status_code == 204
    await asyncio.sleep(POLL_SECONDS * 2)

    after = await served.on_every_worker(call, workers)
    assert {response.status_code for answers in after.values() for response in answers} == {401}
    assert len(upstream.received) == forwarded


async def test_migrations_and_first_run_setup_happen_once_before_the_workers(served: Served) -> None:
    workers = await served.wait_for_workers(WORKERS)
    log = served.log

    # alembic logs its context each time it runs, even with nothing to apply: once, in a child process the parent
    # starts for it (so that the parent keeps none of alembic), never in a worker.
    contexts = re.findall(r"\[(\d+)\] INFO alembic\.runtime\.migration: Context impl", log)
    assert len(contexts) == 1
    migrators = set(re.findall(r"\[(\d+)\] INFO alembic\.runtime\.migration: Running upgrade", log))
    assert migrators == set(contexts) != {str(served.process.pid)}
    assert len(SETUP_LINK.findall(log)) == 1
    assert log.count("credgate is serving at") == 1
    assert not workers & {int(pid) for pid in migrators}


@pytest.mark.parametrize("workers", [1, WORKERS])
def test_a_request_sent_the_moment_the_gateway_says_it_serves_is_answered_not_refused(
    tmp_path: Path, workers: int
) -> None:
    """Its workers (or its server) may not have started: the connection waits for them. Refused, it would make a
    load balancer take the instance out for a while, and a rolling restart could find every instance out."""
    port = free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("CREDGATE_TEST_")}
    env["CREDGATE_DATA_DIR"] = str(tmp_path / "data")
    command = [CREDGATE, "serve", "--port", str(port), "--workers", str(workers)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    output: list[bytes] = []
    silent_too_long = threading.Timer(STARTUP_SECONDS, process.kill)  # the reading below cannot hang the suite
    silent_too_long.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:  # until the announcement, at which the start is not over
            output.append(line)
            if line.startswith(b"credgate is serving at"):
                break
        silent_too_long.cancel()
        started = len(re.findall(rb"Application startup complete", b"".join(output)))
        answer = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=STARTUP_SECONDS)
    finally:
        silent_too_long.cancel()
        process.terminate()
        rest, _ = process.communicate(timeout=30)
        SWEEP.capture("gateway output", b"".join([*output, rest]).decode(errors="replace"))
    assert started == 0, "the announcement came after a server had started: this test no longer tests the wait"
    assert answer.status_code == 200


SSE = "/proxy/stand-in/sse?delay=0.1&n=10"


def listening_sockets(pid: int, port: int) -> set[int]:
    """The inodes of the sockets listening on `port` that process `pid` holds."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                listening.add(int(fields[9]))
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed since the folder was read
            if (target := os.readlink(fd)).startswith("socket:["):
                held.add(int(target[len("socket:[") : -1]))
    return listening & held


async def answered_until(running: Served, done: Callable[[], bool]) -> int:
    """Requests on new connections, one every 0.05 s, each answered 200, until `done`; how many were sent."""
    answered = 0
    deadline = time.monotonic() + 2 * STARTUP_SECONDS
    async with httpx.AsyncClient(timeout=STARTUP_SECONDS) as client:
        while not done():
            assert time.monotonic() < deadline, running.log
            answer = await client.get(f"{running.gateway.url}/healthz", headers={"connection": "close"})
            assert answer.status_code == 200
            answered += 1
            await asyncio.sleep(0.05)
    return answered


def read_response(connection: socket.socket) -> httpx.Response:
    """The answer to the one request sent on `connection` with `connection: close`: read to the end."""
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *fields = head.decode("latin-1").split("\r\n")
    headers = [(name, value) for name, _, value in (field.partition(": ") for field in fields)]
    return httpx.Response(int(status_line.split()[1]), headers=headers, content=body)


async def rest_of(lines: AsyncIterator[str]) -> list[str]:
    return [line async for line in lines]


async def refused_within(url: str, seconds: float) -> bool:
    """Whether a new connection is refused within `seconds`: the listening socket closed in every process."""
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=1) as client:
        while time.monotonic() < deadline:
            try:
                await client.get(f"{url}/readyz", headers={"connection": "close"})
            except httpx.ConnectError:
                return True
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    return False


async def test_a_killed_worker_is_replaced_and_sigterm_then_drains_every_worker_and_exits_0(
    tmp_path: Path, upstream: Upstream
) -> None:
    drain = 3.0
    running = serve(tmp_path, CREDGATE_DRAIN_SECONDS=str(drain))
    try:
        workers = await running.wait_for_workers(WORKERS)
        killed, survivor = sorted(workers)
        killed_socket = listening_sockets(killed, running.port)
        os.kill(killed, signal.SIGKILL)
        # Meanwhile the survivor answers, and a connection that comes to the killed one's socket waits there for
        # the replacement: answered late, not refused.
        await answered_until(running, lambda: bool(running.ready_workers() - workers))
        (replacement,) = await running.wait_for_workers(1, besides=workers)
        assert listening_sockets(replacement, running.port) == killed_socket

        def health(client: httpx.AsyncClient) -> Awaitable[httpx.Response]:
            return client.get(f"{running.gateway.url}/healthz")

        assert (await running.on_every_worker(health, {survivor, replacement})).keys() == {survivor, replacement}
        assert f"worker {killed} died: replaced" in running.log

        # SIGTERM with streams in flight: nothing new is accepted, every stream finishes whole, the parent exits 0.
        project, _ = await add_project(tmp_path / "data", upstream)
        no_reuse = httpx.Limits(max_keepalive_connections=0)
        auth = {"authorization": f"Bearer {project.token}"}
        client = httpx.AsyncClient(base_url=running.gateway.url, headers=auth, limits=no_reuse, timeout=10)
        async with client, contextlib.AsyncExitStack() as streams:
            opened = [(await streams.enter_async_context(client.stream("GET", SSE))).aiter_lines() for _ in range(6)]
            firsts = [await anext(lines) for lines in opened]
            running.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            refused = await refused_within(running.gateway.url, drain)
            rests = await asyncio.gather(*(rest_of(lines) for lines in opened))
        exit_code = await asyncio.to_thread(running.process.wait, drain + 10)
        exited = time.monotonic() - signalled
    finally:
        stop(running)
    assert refused
    events = [
        sum(line.startswith("data: ") for line in [first, *rest]) for first, rest in zip(firsts, rests, strict=True)
    ]
    assert events == [10] * 6
    assert exit_code == 0
    assert exited < drain + 2
    # Each worker, the replacement too, shut down by itself (uvicorn logs this only after a graceful shutdown).
    assert {int(pid) for pid in FINISHED.findall(running.log)} == {survivor, replacement}
    assert "Exception in 'lifespan' protocol" not in running.log  # each closed its database pool in time
    assert "Exception closing connection" not in running.log
    for pid in (survivor, replacement):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_sighup_replaces_every_worker_on_its_socket_and_every_request_meanwhile_is_answered(
    tmp_path: Path,
) -> None:
    running = serve(tmp_path)
    try:
        workers = await running.wait_for_workers(WORKERS)
        sockets = {frozenset(listening_sockets(worker, running.port)) for worker in workers}
        running.process.send_signal(signal.SIGHUP)

        def drained() -> bool:  # the old workers, every one
            return workers <= {int(pid) for pid in FINISHED.findall(running.log)}

        answered = await answered_until(running, drained)
        replacements = await running.wait_for_workers(WORKERS, besides=workers)
        replaced_sockets = {frozenset(listening_sockets(worker, running.port)) for worker in replacements}
    finally:
        stop(running)
    assert answered > 0
    assert replaced_sockets == sockets


async def test_metrics_answered_by_any_worker_count_the_requests_of_every_worker(
    served: Served, upstream: Upstream
) -> None:
    workers = await served.wait_for_workers(WORKERS)
    project, admin_token = await add_project(served.gateway.log.parent / "data", upstream)
    proxy = f"{served.gateway.url}/proxy/stand-in/echo/metrics"

    def call(client: httpx.AsyncClient) -> Awaitable[httpx.Response]:
        return client.get(proxy, headers={"authorization": f"Bearer {project.token}"})

    by_worker = await served.on_every_worker(call, workers)
    proxied = sum(len(answers) for answers in by_worker.values())

    def metrics(client: httpx.AsyncClient) -> Awaitable[httpx.Response]:
        return client.get(f"{served.gateway.url}/metrics", headers={"authorization": f"Bearer {admin_token}"})

    answers = await served.on_every_worker(metrics, workers)
    counted = {
        worker: [
            sample.value
            for response in responses
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
            if sample.name == "credgate_requests_total" and sample.labels["project"] == project.id
        ]
        for worker, responses in answers.items()
    }
    assert counted == {worker: [float(proxied)] * len(answers[worker]) for worker in workers}
