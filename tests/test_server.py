"""The HTTP server around the gateway: the sockets it listens on, what a spawned worker runs before it, and how
long idle connections live."""

import errno
import inspect
import logging
import multiprocessing
import os
import re
import socket
import sys
import types
from pathlib import Path

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from credgate.config import Settings
from credgate.errors import StartupError
from credgate.server import (
    KEEP_ALIVE_SECONDS,
    _main_not_rerun_in_workers,
    bind_listeners,
    listen,
    pin_worker,
    server_config,
)
from tests.e2e.conftest import free_port

SHIPPED_NGINX_CONF = Path(__file__).parents[1] / "docs" / "deploy" / "nginx.conf"
LINUX_ONLY = pytest.mark.skipif(sys.platform != "linux", reason="SO_REUSEPORT spreads connections on Linux only")


@LINUX_ONLY
def test_each_worker_listens_on_a_socket_of_its_own_on_the_one_port(tmp_path: Path) -> None:
    port = free_port()
    listeners = bind_listeners(Settings(data_dir=tmp_path, host="127.0.0.1", port=port, workers=3))
    try:
        assert len(set(listeners.main)) == 3
        assert {listener.getsockname() for listener in listeners.main} == {("127.0.0.1", port)}
        assert all(listener.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for listener in listeners.main)
        assert [listeners.of_worker(index) for index in range(3)] == [[listener] for listener in listeners.main]
    finally:
        for listener in listeners.all():
            listener.close()


@pytest.mark.parametrize(("running", "starting"), [(2, 2), (1, 2), (2, 1)])
def test_a_second_gateway_on_a_port_in_use_fails_to_start_whatever_its_workers(
    tmp_path: Path, running: int, starting: int
) -> None:
    """SO_REUSEPORT would let sockets that all set it share the port: the one gateway's workers, and also a
    second gateway started on it by mistake, which would take connections unnoticed."""
    port = free_port()
    first = bind_listeners(Settings(data_dir=tmp_path, host="127.0.0.1", port=port, workers=running))
    listen(first.all())
    try:
        with pytest.raises(StartupError, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"):
            bind_listeners(Settings(data_dir=tmp_path, host="127.0.0.1", port=port, workers=starting))
    finally:
        for listener in first.all():
            listener.close()


def _spawned_exit_code() -> int | None:
    worker = multiprocessing.get_context("spawn").Process(target=os.getpid)  # uvicorn spawns its workers
    worker.start()
    worker.join(30)
    return worker.exitcode


def test_a_spawned_worker_does_not_run_the_credgate_script_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "credgate"
    script.write_text("import sys\nsys.exit('the script ran again in a worker')\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    main.__spec__ = None  # as for a console script
    monkeypatch.setitem(sys.modules, "__main__", main)

    assert _spawned_exit_code() == 1  # what multiprocessing does by itself

    with _main_not_rerun_in_workers():
        assert _spawned_exit_code() == 0
    assert main.__spec__ is None


def test_the_shipped_nginx_drops_idle_connections_to_credgate_before_credgate_closes_them(tmp_path: Path) -> None:
    """Otherwise nginx may send a request on a connection an instance is closing: with `max_fails=1` each such
    race takes that instance out, and when it hits all of them at once nginx answers 502."""
    assert server_config(None, Settings(data_dir=tmp_path)).timeout_keep_alive == KEEP_ALIVE_SECONDS
    upstream = re.search(r"upstream credgate \{(.*?)\}", SHIPPED_NGINX_CONF.read_text(), re.DOTALL)
    assert upstream is not None
    timeout = re.search(r"^\s*keepalive_timeout (\d+)s;", upstream.group(1), re.MULTILINE)
    assert timeout is not None, "the upstream block keeps idle connections for nginx's default 60 s"
    assert int(timeout.group(1)) < KEEP_ALIVE_SECONDS


def test_uvicorn_still_reads_a_header_as_the_gateways_protocol_repeats_it() -> None:
    """BoundedHttpProtocol.on_header repeats uvicorn's, counting headers as it goes (in uvicorn's list, new for each
    request): should uvicorn's change, ours must take the change too."""
    assert "        self.headers = []\n" in inspect.getsource(HttpToolsProtocol.on_message_begin)
    assert inspect.getsource(HttpToolsProtocol.on_header) == (
        "    def on_header(self, name: bytes, value: bytes) -> None:\n"
        "        name = name.lower()\n"
        '        if name == b"expect" and value.lower() == b"100-continue":\n'
        "            self.expect_100_continue = True\n"
        "        self.headers.append((name, value))\n"
    )


@LINUX_ONLY
def test_a_worker_that_may_not_use_its_core_runs_unpinned_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Its cpuset shrank since the gateway started: failing the worker would have it replaced, and fail, for ever.
    def refused(_thread: int, _cores: object) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {2, 5})
    monkeypatch.setattr(os, "sched_setaffinity", refused)
    with caplog.at_level(logging.WARNING, "credgate.server"):
        pin_worker(3)
    assert caplog.messages == ["worker 3 could not pin itself to core 5: Invalid argument"]
