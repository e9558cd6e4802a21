"""Redis for the tests: the machine's server (CREDGATE_TEST_REDIS_URL, which the README's test command sets when
one answers), or a private `redis-server` of the test's own that it may stop and start again."""

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REDIS_URL = os.environ.get("CREDGATE_TEST_REDIS_URL")
REQUIRE_REDIS = os.environ.get("CREDGATE_TEST_REQUIRE_REDIS") == "1"


def shared_redis_url() -> str:
    """The machine's Redis; the test skips (or, in CI, fails) without one."""
    if not REDIS_URL:
        if REQUIRE_REDIS:
            pytest.fail("CREDGATE_TEST_REQUIRE_REDIS=1 but CREDGATE_TEST_REDIS_URL is not set")
        pytest.skip("Redis tests need CREDGATE_TEST_REDIS_URL (the README's test command sets it)")
    return REDIS_URL


def unique_namespace() -> str:
    return f"credgate-test-{secrets.token_hex(6)}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateRedis:
    """A redis-server of one test's own, on a free port, keeping nothing on disk."""

    def __init__(self, directory: Path) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._directory = directory
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            str(shutil.which("redis-server")),
            *("--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
            *("--dir", str(self._directory)),
        ]
        self._process = process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert process.poll() is None, "the private redis-server exited (its port taken since it was chosen?)"
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1) as probe:
                probe.sendall(b"PING\r\n")
                if probe.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.02)
        raise AssertionError("the private redis-server did not start")

    def pause(self) -> None:
        """Stop the server without closing anything: its connections stay open and silent (a hung Redis)."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)  # a paused server could not die
            self._process.kill()
            self._process.wait(10)
            self._process = None

    async def restart_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.start()


@contextmanager
def private_redis(directory: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        if REQUIRE_REDIS:
            pytest.fail("redis-server is not installed (Debian's redis-server package)")
        pytest.skip("this test starts a private redis-server: install Debian's redis-server")
    server = PrivateRedis(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def calls_sent(owner: object, script: str) -> list[tuple[int, int]]:
    """Note how many keys and arguments each call of `owner`'s script attribute `script` sends to Redis (what
    redis-py writes one by one in Python), and pass the call on."""
    sent: list[tuple[int, int]] = []
    call = getattr(owner, script)

    async def noting(*, keys: list[str], args: list[object]) -> object:
        sent.append((len(keys), len(args)))
        return await call(keys=keys, args=args)

    setattr(owner, script, noting)
    return sent
