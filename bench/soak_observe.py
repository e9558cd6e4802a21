"""What the soak observes from outside the gateway: its RSS and open fds in /proc, its asyncio tasks through
bench/instrumented_serve.py's probe, and the upstream side of its connections from the stand-in's control port."""

import asyncio
import json
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness import PROBE_PREFIX, database_fds, open_fds, rss_mb

PROBE_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Sample:
    rss_mib: float
    fds: int
    tasks: int
    upstream_open: int  # connections the gateway holds to the upstream, idle in its pool or answering
    upstream_active: int  # of those, the ones with a response under way
    database: int = 0  # fds on the SQLite database's files, the database pool's

    @property
    def own_fds(self) -> int:
        """The fds that are neither upstream connections nor the database pool's: those kept for reuse are the
        pools', not leaks (the upstream counts its connections exactly, /proc names the database's files)."""
        return self.fds - self.upstream_open - self.database


class Observer:
    def __init__(self, gateway: asyncio.subprocess.Process, control_port: int) -> None:
        self.gateway = gateway
        self.control_port = control_port

    async def tasks(self) -> int:
        """The gateway's asyncio task count, as its probe reports it on a signal."""
        output = self.gateway.stdout
        if output is None:
            raise RuntimeError("the gateway's standard output is not a pipe")
        self.gateway.send_signal(signal.SIGUSR1)
        async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
            while True:
                line = (await output.readline()).decode()
                if not line:
                    raise RuntimeError("the gateway closed its standard output")
                if line.startswith(PROBE_PREFIX):
                    return int(json.loads(line[len(PROBE_PREFIX) :])["tasks"])

    async def upstream(self, what: str = "stats") -> dict[str, Any]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.control_port)
        writer.write(f"GET /{what} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        answer = await reader.read()
        writer.close()
        result: dict[str, Any] = json.loads(answer.partition(b"\r\n\r\n")[2])
        return result

    async def sample(self) -> Sample:
        upstream = await self.upstream()
        pid = self.gateway.pid
        return Sample(
            rss_mb(pid), open_fds(pid), await self.tasks(), upstream["open"], upstream["active"], database_fds(pid)
        )

    async def settle(self, holds: Callable[[Sample], bool], within: float) -> tuple[Sample, float]:
        """Sample until `holds` (or `within` seconds have passed); returns the last sample and when it was taken."""
        started = time.monotonic()
        while True:
            sample = await self.sample()
            elapsed = time.monotonic() - started
            if holds(sample) or elapsed >= within:
                return sample, elapsed
            await asyncio.sleep(0.2)

    async def closes(self, left_at: dict[str, float], within: float) -> dict[str, float]:
        """For each client that left, how long after it left the upstream saw the connection of its stream close
        (infinite: not within `within` seconds of this call)."""
        deadline = time.monotonic() + within
        while True:
            closed_at = await self.upstream("closes")
            if all(stream in closed_at for stream in left_at) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.2)
        return {stream: closed_at.get(stream, math.inf) - left for stream, left in left_at.items()}
