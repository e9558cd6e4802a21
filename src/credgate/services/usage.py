"""Usage: a record of every proxied request, written in batches off the hot path; token counts are read
from the response's `usage` object (JSON, or the SSE events that carry one) after the response has gone."""

import asyncio
import json
import logging
import re
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

import orjson

from credgate import metrics
from credgate.errors import InvalidInput
from credgate.limits import ListLimit, Moment, within
from credgate.services.context import Context
from credgate.services.projects import require_project
from credgate.spending import BudgetRule, Charge, Price, cost_micros
from credgate.storage import RequestRow, UsageRow
from credgate.storage.models import RequestRecord

logger = logging.getLogger(__name__)
KEPT_BODY_BYTES = 64 * 1024  # the head of a response body kept for token counts
TAIL_CHUNK_BYTES = 4096  # and the last bytes of each of its last 16 chunks
COUNTED_CONTENT_TYPES = ("application/json", "text/event-stream")
_MAX_INFLATED_BYTES = 1024 * 1024
_TOKEN_TOUCH_RESOLUTION = timedelta(minutes=1)
_PRUNE_INTERVAL_SECONDS = 3600
_MODEL_FIELD = re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')
# A key `model` with a name, then a key `usage`: neighbours in one object (a JSON string holds no bare quote).
_MODEL_THEN_USAGE = re.compile(_MODEL_FIELD.pattern + rb'\s*,\s*"usage"\s*:')
_LONG_JSON_BYTES = 8192  # under this, a whole body is parsed: a few µs
_NULL_VALUE = re.compile(rb"\s*:\s*null")


@dataclass(slots=True)
class ProxiedRequest:
    """What the proxy tells the recorder about one request; `head` and `tail` are body bytes, not copies."""

    at: datetime
    project_id: str
    token_hash: str
    request_id: str
    method: str
    provider: str
    endpoint: str
    status: int = 0
    duration_ms: float = 0.0
    request_bytes: int = 0
    response_bytes: int = 0
    content_type: str = ""
    content_encoding: str = ""
    head: list[bytes] = field(default_factory=list)
    tail: deque[bytes] | None = None  # made once the head is full: most bodies never need one
    counts_tokens: bool = False  # the response's type is one whose usage the recorder reads
    started: float = 0.0  # time.perf_counter() when the request arrived
    overhead_ms: float | None = None  # the gateway's own time, where an upstream was asked (the rest is waiting)
    kept: int = 0  # bytes in `head`
    # Told the token counts once the recorder has read them (a trace's span waits for them to end).
    on_tokens: Callable[[int | None, int | None], None] | None = None
    prices: tuple[Price, ...] = ()  # the integration's price list, for the response's cost
    budgets: tuple[BudgetRule, ...] = ()  # the budgets that admitted it: settled from its usage
    admitted: bool = False  # it passed every check: sent (or about to be sent) upstream
    subject: str | None = None  # the end user of a client or identity token

    def start_response(self, status: int, content_type: str, content_encoding: str) -> None:
        self.status = status
        self.content_type = content_type
        self.content_encoding = content_encoding
        self.counts_tokens = content_type.startswith(COUNTED_CONTENT_TYPES)

    def capture(self, chunk: bytes) -> None:
        """Count a chunk of the response body, keeping (not copying) what the token count reads: the head of
        the body, then the end of each of its last chunks."""
        self.response_bytes += len(chunk)
        if not self.counts_tokens:
            return
        if self.kept < KEPT_BODY_BYTES:
            self.head.append(chunk)
            self.kept += len(chunk)
        else:
            if self.tail is None:
                self.tail = deque(maxlen=16)
            self.tail.append(chunk[-TAIL_CHUNK_BYTES:])


class Usage(NamedTuple):
    """What a response reported of its usage: tokens, and the model that answered."""

    prompt: int | None = None
    completion: int | None = None
    model: str | None = None

    def over(self, later: "Usage") -> "Usage":
        """This usage with what a later event reported in its place (a stream reports in parts)."""
        return Usage(
            later.prompt if later.prompt is not None else self.prompt,
            later.completion if later.completion is not None else self.completion,
            later.model or self.model,
        )


def _model_of(document: dict[str, object]) -> str | None:
    """The model a response names, when it is a name: printable text (no NUL or lone surrogate, which a database
    refuses), cut to 200 characters."""
    model = document.get("model")
    if not isinstance(model, str) or not model or not model.isprintable():  # a lone surrogate is not printable
        return None
    return model[:200]


def _count(value: object) -> int | None:
    """A token count as reported, when it is one: a whole number, not negative, and within what a column (and a
    counter) holds."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else None


def _usage_of(document: object) -> Usage:
    if not isinstance(document, dict):
        return Usage()
    usage, model = document.get("usage"), _model_of(document)
    if not isinstance(usage, dict):
        message = document.get("message")  # Anthropic's message_start
        if not isinstance(message, dict):
            return Usage(model=model)
        usage, model = message.get("usage"), _model_of(message) or model
        if not isinstance(usage, dict):
            return Usage(model=model)
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    return Usage(_count(prompt), _count(completion), model)


def _inflate(body: bytes, encoding: str) -> bytes:
    """A gzip or deflate body decompressed (at most 1 MiB of it); other encodings are left as they are."""
    if encoding not in ("gzip", "deflate", "x-gzip"):
        return body
    try:
        return zlib.decompressobj(wbits=47).decompress(body, _MAX_INFLATED_BYTES)  # 47: gzip or zlib header
    except zlib.error:
        return b""


def _parsed(document: bytes) -> object:
    """A JSON document, by orjson where it can (a quarter of json's time: 0.7 µs against 2.6 for a chat completion,
    read for every response and every event of a stream); what orjson refuses and json reads (NaN, lone
    surrogates, UTF-16) is read by json. The one difference, an integer past 64 bits read as a float, is no token
    count either way (`_count`)."""
    try:
        return orjson.loads(document)
    except orjson.JSONDecodeError:
        return json.loads(document)


def _usage_at_end(head: bytes, tail: bytes) -> Usage:
    """The `usage` object near the end of a JSON body too long to keep whole (embeddings, say); the model from
    near its start, else from just before that object (where an embeddings answer names it, after its data)."""
    start = tail.rfind(b'"usage"')
    found = _MODEL_FIELD.search(head[:4096])
    if found is None and start > 0:
        named = list(_MODEL_FIELD.finditer(tail, max(0, start - 512), start))
        found = named[-1] if named else None
    model = _model_of({"model": found.group(1).decode("utf-8", "replace")}) if found else None
    colon = tail.find(b":", start)
    if start < 0 or colon < 0:
        return Usage(model=model)
    try:
        usage, _ = json.JSONDecoder().raw_decode(tail[colon + 1 :].decode("utf-8", "replace").lstrip())
    except ValueError:
        return Usage(model=model)
    return _usage_of({"usage": usage, "model": model})


def _closing_usage(body: bytes) -> Usage | None:
    """The usage and model of a whole JSON body that ends with its root's `"model": …, "usage": {…}` (an
    embeddings answer's shape), read without parsing the numbers before them (0.5 ms for one embedding of 1,536);
    None when it does not end so. They are the root's own: neighbours, and what follows the usage (parsed as an
    object's members) closes one object and the body, with no second `model` or `usage` of the root's."""
    ends = list(_MODEL_THEN_USAGE.finditer(body, max(0, len(body) - 4096)))
    if not ends:
        return None
    found = ends[-1]
    try:
        text = body[found.end() :].decode("utf-8").lstrip()
        usage, end = json.JSONDecoder().raw_decode(text)
        rest = json.loads("{" + text[end:].lstrip().removeprefix(","))
        model = found.group(1).decode("utf-8")
    except ValueError:  # UnicodeDecodeError included
        return None
    if not isinstance(rest, dict) or "model" in rest or "usage" in rest:
        return None
    return _usage_of({"usage": usage, "model": model})


def extract_usage(content_type: str, head: bytes, tail: bytes, *, content_encoding: str = "") -> Usage:
    """Tokens and model of a response, from its JSON body or its server-sent events."""
    head = _inflate(head, content_encoding)
    tail = b"" if content_encoding else tail  # a compressed tail cannot be read on its own
    if content_type.startswith("application/json"):
        if tail:  # the body went on past its kept head, which no parse can take whole: its end is read first
            found = _usage_at_end(head, tail)
            if found.prompt is not None or found.completion is not None:
                return found
        elif len(head) > _LONG_JSON_BYTES and (closing := _closing_usage(head)) is not None:
            return closing
        try:
            return _usage_of(_parsed(head))
        except ValueError:
            return _usage_at_end(head, tail)
    if content_type.startswith("text/event-stream"):
        return _stream_usage((head, tail))
    return Usage()


def _stream_usage(chunks: tuple[bytes, ...]) -> Usage:
    """What a stream's events reported, as reading each in turn would (`Usage.over`): the counts of those that
    name `usage`, in order, and the model of the last that names a valid one. Only those are parsed, not the
    hundreds of events that each carry a few words (a key spelled with escapes, which no encoder writes for a
    plain name, would go unseen). A chat completion of 400 events: 45 µs, against 700 parsing each (1,350 by json);
    150 µs when each names a null usage (OpenAI's, asked for usage in the stream), against 870 parsing those."""
    found = Usage()
    for chunk in chunks:
        # OpenAI's events name a null usage, all but the last, when the client asked for usage in the stream
        for line in _lines_naming(chunk, b'"usage"', unless=_NULL_VALUE):
            found = found.over(_event_usage(line))
    for chunk in reversed(chunks):
        for line in _lines_naming(chunk, b'"model"', from_end=True):
            if model := _event_usage(line).model:
                return found._replace(model=model)
    return found._replace(model=None)


def _lines_naming(
    chunk: bytes, key: bytes, *, from_end: bool = False, unless: re.Pattern[bytes] | None = None
) -> Iterator[bytes]:
    """The lines of `chunk` (split at each LF) that hold `key`, in order or from the last; not counting a `key`
    that `unless` matches right after (an event whose every usage is null counts nothing)."""
    at = chunk.rfind(key) if from_end else chunk.find(key)
    while at >= 0:
        if unless is not None and unless.match(chunk, at + len(key)):
            at = chunk.rfind(key, 0, at) if from_end else chunk.find(key, at + len(key))
            continue
        start = chunk.rfind(b"\n", 0, at) + 1
        end = chunk.find(b"\n", at)
        end = len(chunk) if end < 0 else end
        yield chunk[start:end]
        at = (chunk.rfind(key, 0, start - 1) if start else -1) if from_end else chunk.find(key, end)


def _event_usage(line: bytes) -> Usage:
    if not line.startswith(b"data:"):
        return Usage()
    try:
        return _usage_of(_parsed(line[5:]))
    except ValueError:
        return Usage()


def extract_tokens(
    content_type: str, head: bytes, tail: bytes, *, content_encoding: str = ""
) -> tuple[int | None, int | None]:
    """Prompt and completion tokens of a response, from its JSON body or its server-sent events."""
    usage = extract_usage(content_type, head, tail, content_encoding=content_encoding)
    return usage.prompt, usage.completion


def _record_of(request: ProxiedRequest) -> RequestRow:
    head = b"".join(request.head)
    tail = b"".join(request.tail) if request.tail else b""  # there is one only past a full head
    prompt, completion, model = extract_usage(
        request.content_type, head, tail, content_encoding=request.content_encoding.lower()
    )
    cost = cost_micros(request.prices, model, prompt, completion) if request.prices else None
    if request.on_tokens is not None:
        try:
            request.on_tokens(prompt, completion)
        except Exception:  # a listener's failure must not cost the batch its records
            logger.exception("could not report the tokens of request %s", request.request_id)
    return RequestRow(
        request.at,
        request.project_id,
        request.request_id,
        request.method,
        request.provider,
        request.endpoint[:2048],
        request.status,
        round(request.duration_ms, 3),
        request.request_bytes,
        request.response_bytes,
        prompt,
        completion,
        model,
        cost,
        request.admitted,
        request.subject,
    )


class _Pending(NamedTuple):
    """A request as the next batch writes it: its row, its usage already read, and what the write also needs."""

    row: RequestRow
    token_hash: str
    budgets: tuple[BudgetRule, ...]


def _count_tokens(batch: Iterable[_Pending]) -> None:
    """Count the tokens of `batch` in the metrics: one count for each project's provider, not two a request
    (each a call into prometheus-client, and its lock)."""
    totals: dict[tuple[str, str], list[int]] = {}
    for pending in batch:
        row = pending.row
        prompt, completion = row.prompt_tokens, row.completion_tokens
        if prompt or completion:
            total = totals.setdefault((row.project_id, row.provider), [0, 0])
            total[0] += prompt or 0
            total[1] += completion or 0
    for (project_id, provider), (prompt, completion) in totals.items():
        metrics.tokens_counted(project_id, provider, prompt, completion)


def _charges(batch: Sequence[_Pending]) -> list[Charge]:
    """What each response of `batch` adds to the budgets that admitted it (tokens, cost)."""
    charges = []
    for row, _, budgets in batch:
        for rule in budgets:
            amount = rule.charge(row.prompt_tokens, row.completion_tokens, row.cost_micros)
            if amount:
                charges.append((rule, row.at, amount))
    return charges


class UsageRecorder:
    """Collects proxied requests in memory and writes them in batches; never blocks the proxy.

    A request's usage is read as it is recorded, its response over, so that a pending request holds its row and
    not its body's bytes (up to 64 KiB). Reading them in the write instead, in slices between yields to the event
    loop, stretched a write to 170 ms at 64 connections, while the next 800 requests piled up, their bodies and
    their rows held at once.

    A batch is written every `flush_seconds`, or as soon as `batch_size` requests are pending. Not smaller: a
    write costs about 2 ms of CPU whatever its size (seven round trips to the SQLite thread, the commit's fsync),
    and batches of 64 cost a worker at 3,000 requests/s about 10% of its throughput. When the database cannot
    keep up, the oldest pending records are dropped (and counted) rather than letting memory grow or requests
    wait.
    """

    def __init__(
        self,
        ctx: Context,
        *,
        retention: timedelta = timedelta(days=30),
        max_pending: int = 20_000,
        flush_seconds: float = 0.1,
        batch_size: int = 512,
    ) -> None:
        self._ctx = ctx
        # Told what each response spent of the budgets that admitted it (the proxy's budget counters).
        self.settle: Callable[[Sequence[Charge]], None] | None = None
        self._retention = retention
        self._next_prune = 0.0
        self._pending: deque[_Pending] = deque(maxlen=max_pending)
        self._flush_seconds = flush_seconds
        self._batch_size = batch_size
        self._batch_ready = asyncio.Event()
        self._token_touched: dict[str, datetime] = {}

    def record(self, request: ProxiedRequest) -> None:
        try:
            row = _record_of(request)
        except Exception:  # the response has gone: a bug here must cost its record, not the request
            logger.exception("could not read the record of request %s", request.request_id)
            return
        if len(self._pending) == self._pending.maxlen:
            metrics.request_records_dropped.inc()
            _count_tokens([self._pending[0]])  # the record dropped: its tokens were spent all the same
        self._pending.append(_Pending(row, request.token_hash, request.budgets))
        if len(self._pending) >= self._batch_size:
            self._batch_ready.set()

    async def run(self) -> None:
        """Flush until cancelled; then the flush under way ends, and a last one writes what is left. A flush is
        never cancelled midway: it has taken its batch from the queue, and its transaction would be rolled back."""
        flushing: asyncio.Future[None] | None = None
        try:
            while True:
                await self._next_batch()
                flushing = asyncio.ensure_future(self.flush())
                await asyncio.shield(flushing)
                if time.monotonic() >= self._next_prune:
                    self._next_prune = time.monotonic() + _PRUNE_INTERVAL_SECONDS
                    await self.prune()
        finally:
            await asyncio.shield(self._last_flush(flushing))

    async def _last_flush(self, under_way: asyncio.Future[None] | None) -> None:
        if under_way is not None:
            await under_way
        await self.flush()

    async def _next_batch(self) -> None:
        """Until `flush_seconds` have passed, or a batch's worth is pending, if sooner."""
        self._batch_ready.clear()
        if len(self._pending) >= self._batch_size:
            return
        try:
            async with asyncio.timeout(self._flush_seconds):
                await self._batch_ready.wait()
        except TimeoutError:
            pass

    async def flush(self) -> None:
        batch = [self._pending.popleft() for _ in range(len(self._pending))]
        if not batch:
            return
        try:
            _count_tokens(batch)
            if self.settle is not None:
                self.settle(_charges(batch))
            touched = self._tokens_to_touch(batch)
            async with self._ctx.database.transaction() as repo:
                await repo.insert_request_records([pending.row for pending in batch])
                if touched:
                    await repo.touch_project_tokens(touched, at=self._ctx.clock())
        except Exception:
            logger.exception("could not write %d request records", len(batch))

    async def prune(self) -> None:
        """Forget requests older than the retention period."""
        try:
            async with self._ctx.database.transaction() as repo:
                await repo.delete_request_records(before=self._ctx.clock() - self._retention)
        except Exception:
            logger.exception("could not prune the request log")

    def _tokens_to_touch(self, batch: Sequence[_Pending]) -> list[str]:
        now = self._ctx.clock()
        touched = []
        for token_hash in {pending.token_hash for pending in batch if pending.token_hash}:
            last = self._token_touched.get(token_hash)
            if last is None or now - last > _TOKEN_TOUCH_RESOLUTION:
                self._token_touched[token_hash] = now
                touched.append(token_hash)
        if len(self._token_touched) > 100_000:
            self._token_touched.clear()
        return touched


async def list_request_records(ctx: Context, *, project_id: str, limit: int = 100) -> Sequence[RequestRecord]:
    within("limit", ListLimit, limit)
    async with ctx.database.transaction(write=False) as repo:
        await require_project(repo, project_id)
        return await repo.list_request_records(project_id, limit=limit)


async def summarize_usage(
    ctx: Context, *, project_id: str, since: datetime | None, until: datetime | None, group_by: str | None
) -> tuple[datetime, datetime, Sequence[UsageRow]]:
    """Totals of requests, errors and tokens; by default over the last 30 days."""
    for name, moment in (("since", since), ("until", until)):
        if moment is not None:
            within(name, Moment, moment)
    until = until or ctx.clock()
    since = since or until - timedelta(days=30)
    if since >= until:
        raise InvalidInput("since", "must be before until")
    async with ctx.database.transaction(write=False) as repo:
        await require_project(repo, project_id)
        return since, until, await repo.usage_totals(project_id, since=since, until=until, group_by=group_by)
