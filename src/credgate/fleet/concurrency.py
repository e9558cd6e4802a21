"""Caps on a project's requests under way at once: per process (a count in memory), or once for every worker and
instance that share a Redis.

In Redis, a project's requests under way are the members of one sorted set, each scored with the end of its
lease. A request takes a place when fewer members than the cap hold an unexpired lease and gives it back as it
ends (before its response's last bytes, so that a client may send its next request at once): one script call for
the requests of each event-loop turn, either way. Each process renews the leases of its requests every third of a
lease, so a long stream keeps its place, while the places of a process that dies free themselves when their
leases run out. When Redis does not answer, places are counted in this process (logged once), and Redis is tried
again a second later.
"""

import asyncio
import contextlib
import itertools
import logging
import secrets
from dataclasses import dataclass
from typing import Protocol

from credgate.fleet.fleet import ANSWER_TIMEOUT_SECONDS, RETRY_SECONDS, Fleet, ScriptKeys
from credgate.fleet.turns import TurnBatch
from credgate.outages import Outage

logger = logging.getLogger(__name__)

LEASE_SECONDS = 30.0

# KEYS are the projects' sets, each once; ARGV[1] the lease in ms, ARGV[2] the takes in order, each a set's index in
# KEYS, its cap and the request's member ("1 8 a1b2:17 1 8 a1b2:18"): packed so, a turn of 20 requests sends 3
# arguments instead of 41 (redis-py writes each in Python). Returns, for each take, 1 when it took a place, else 0.
# Time is Redis's own clock, so instances whose clocks differ still agree.
_TAKE = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local lease = tonumber(ARGV[1])
local taken = {}
for index, cap, member in string.gmatch(ARGV[2], '(%d+) (%d+) (%S+)') do
  local key = KEYS[tonumber(index)]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
  if redis.call('ZCARD', key) < tonumber(cap) then
    redis.call('ZADD', key, now_ms + lease, member)
    redis.call('PEXPIRE', key, lease)
    taken[#taken + 1] = 1
  else
    taken[#taken + 1] = 0
  end
end
return taken
"""
# KEYS[i] a set, ARGV[1] the lease in ms, ARGV[i + 1] a member of it still under way: its lease starts again. A
# member Redis lost meanwhile (a restart, an outage longer than a lease) is put back, so the count is whole again.
_RENEW = """
local now = redis.call('TIME')
local until_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, until_ms, ARGV[i + 1])
  redis.call('PEXPIRE', key, tonumber(ARGV[1]))
end
return 0
"""
# KEYS are sets, each once; ARGV[1] the places given back, each a set's index in KEYS and a member of it whose
# request has ended ("1 a1b2:17 1 a1b2:18").
_RELEASE = """
for index, member in string.gmatch(ARGV[1], '(%d+) (%S+)') do
  redis.call('ZREM', KEYS[tonumber(index)], member)
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Place:
    """A request's place under its project's cap, to be given back when it ends."""

    project_id: str
    member: str | None = None  # its member in Redis; None: counted in this process


class Places(Protocol):
    async def take(self, project_id: str, cap: int) -> Place | None:
        """A place, or None when `cap` of the project's requests are already under way."""
        ...

    def give_back(self, place: Place) -> None:
        """Never waits, never raises."""
        ...

    async def free(self, place: Place) -> None:
        """Give the place back and return once every process counts it free: within Redis's answer timeout, or at
        once while Redis is known not to answer (its lease frees it then). Never raises but for a cancellation."""
        ...


class LocalPlaces:
    """The project's requests under way in this process."""

    def __init__(self) -> None:
        self._under_way: dict[str, int] = {}

    def take_now(self, project_id: str, cap: int) -> Place | None:
        count = self._under_way.get(project_id, 0)
        if count >= cap:
            return None
        self._under_way[project_id] = count + 1
        return Place(project_id)

    async def take(self, project_id: str, cap: int) -> Place | None:
        return self.take_now(project_id, cap)

    def give_back(self, place: Place) -> None:
        count = self._under_way.get(place.project_id, 0) - 1
        if count > 0:
            self._under_way[place.project_id] = count
        else:
            self._under_way.pop(place.project_id, None)

    async def free(self, place: Place) -> None:
        self.give_back(place)


class SharedPlaces:
    """The Places of a fleet: counted in Redis, in `local` while Redis does not answer."""

    def __init__(self, fleet: Fleet, local: LocalPlaces, *, lease_seconds: float = LEASE_SECONDS) -> None:
        self._fleet = fleet
        self._take = fleet.redis.register_script(_TAKE)
        self._renew = fleet.redis.register_script(_RENEW)
        self._release = fleet.redis.register_script(_RELEASE)
        self._local = local
        self._lease_ms = int(lease_seconds * 1000)
        self._renew_seconds = lease_seconds / 3
        self._outage = Outage(
            logger,
            down="Redis does not answer (%s): requests under way are counted per process until it does",
            back="Redis answers again: requests under way are counted for the fleet again",
            retry_seconds=RETRY_SECONDS,
        )
        process = secrets.token_hex(8)  # the members of this process, apart from every other's
        self._member_ids = (f"{process}:{number}" for number in itertools.count())
        self._held: dict[str, str] = {}  # member → its set: the places of this process's requests under way
        # (set, member, cap) → whether it took a place; one whose request left meanwhile goes back.
        self._takes: TurnBatch[tuple[str, str, int], bool] = TurnBatch(self._call, self._outage, abandoned=self._left)
        # (set, member): the places given back in a turn, in one call; while Redis fails, their leases free them.
        self._returns: TurnBatch[tuple[str, str], None] = TurnBatch(self._remove, self._outage, ends_outage=False)
        self._renewing: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()

    async def take(self, project_id: str, cap: int) -> Place | None:
        key, member = self._fleet.key("under-way", project_id), next(self._member_ids)
        taken = await self._takes.ask((key, member, cap))
        if taken is None:
            return self._local.take_now(project_id, cap)
        if not taken:
            return None
        self._held[member] = key
        self._keep_renewing()
        return Place(project_id, member)

    def give_back(self, place: Place) -> None:
        member = self._released(place)
        if member is not None:
            self._returns.tell(member)

    async def free(self, place: Place) -> None:
        member = self._released(place)
        if member is None:
            return
        if self._outage.failing:  # dropped, as a give-back: the takes keep the one call a second that tries Redis
            self._returns.tell(member)
            return
        # A renewal on its way may put the place back for a moment, until the removal it then asks for.
        try:
            await self._returns.ask(member)
        except asyncio.CancelledError:  # maybe before the turn's call, which would then leave it out
            self._returns.tell(member)
            raise

    def _released(self, place: Place) -> tuple[str, str] | None:
        """The (set, member) to remove from Redis, once; a place counted in this process is given back here."""
        if place.member is None:
            self._local.give_back(place)
            return None
        key = self._held.pop(place.member, None)
        return None if key is None else (key, place.member)

    def _left(self, asked: tuple[str, str, int], taken: bool) -> None:
        """A request that left as its place was being taken: the place goes back."""
        if taken:
            self._returns.tell((asked[0], asked[1]))

    async def _call(self, takes: list[tuple[str, str, int]]) -> list[bool]:
        keys = ScriptKeys()
        packed = " ".join(f"{keys.of(key)} {cap} {member}" for key, member, cap in takes)
        try:
            taken = await self._take(keys=list(keys), args=[self._lease_ms, packed])
        except BaseException:
            # A call that timed out may still have taken places, which its requests, counted here, do not hold.
            for key, member, _ in takes:
                self._returns.tell((key, member))
            raise
        return [bool(int(one)) for one in taken]

    async def _remove(self, places: list[tuple[str, str]]) -> list[None]:
        keys = ScriptKeys()
        packed = " ".join(f"{keys.of(key)} {member}" for key, member in places)
        await self._release(keys=list(keys), args=[packed])
        return [None] * len(places)

    def _keep_renewing(self) -> None:
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.ensure_future(self._renew_while_held())

    async def _renew_while_held(self) -> None:
        while self._held:
            with contextlib.suppress(TimeoutError):  # the next renewal is due, unless the process stops first
                async with asyncio.timeout(self._renew_seconds):
                    await self._closing.wait()
            held = list(self._held.items())
            if not held or self._closing.is_set():
                return
            try:
                async with asyncio.timeout(ANSWER_TIMEOUT_SECONDS):
                    await self._renew(keys=[key for _, key in held], args=[self._lease_ms, *(m for m, _ in held)])
            except Exception as error:  # tried again at the next renewal, well within the lease
                self._outage.failed(error)
                continue
            # A place given back while the renewal was on its way may have been put back by it: remove it again.
            for member, key in held:
                if member not in self._held:
                    self._returns.tell((key, member))

    async def aclose(self) -> None:
        """Give back what is being given back, let the calls under way end (shutting down): places still held
        run out. A renewal under way ends by itself (within the answer timeout): a Redis call cut off by a
        cancellation can leave the client waiting on its connection."""
        self._closing.set()
        await self._takes.aclose()
        if self._renewing is not None:
            await asyncio.gather(self._renewing, return_exceptions=True)
        await self._returns.aclose()
