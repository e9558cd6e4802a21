"""Usage records: tokens read from JSON and SSE bodies, kept for the retention period, then pruned."""

import asyncio
import contextlib
import gzip
import json
import random
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from credgate.config import Settings
from credgate.services import projects, usage
from credgate.services.bootstrap import open_context
from credgate.services.context import Context
from credgate.services.usage import ProxiedRequest, UsageRecorder, extract_tokens
from credgate.storage.models import RequestRecord
from credgate.storage.repository import Repository, RequestRow
from tests.polling import eventually


def proxied(project_id: str, at: datetime, body: bytes = b"{}") -> ProxiedRequest:
    return ProxiedRequest(
        at=at,
        project_id=project_id,
        token_hash="h",
        request_id="r",
        method="POST",
        provider="openai",
        endpoint="chat/completions",
        status=200,
        content_type="application/json",
        head=[body],
        response_bytes=len(body),
    )


@pytest.mark.parametrize(
    ("content_type", "body", "expected"),
    [
        ("application/json", b'{"usage": {"prompt_tokens": 9, "completion_tokens": 3}}', (9, 3)),
        ("application/json", b'{"usage": {"input_tokens": 7, "output_tokens": 2}}', (7, 2)),
        ("application/json", b'{"no": "usage"}', (None, None)),
        ("application/json", b"not json", (None, None)),
        (
            "text/event-stream",
            b'data: {"x": 1}\n\ndata: {"usage": {"prompt_tokens": 5, "completion_tokens": 3}}\n\ndata: [DONE]\n\n',
            (5, 3),
        ),
        (
            "text/event-stream",
            b'data: {"type": "message_start", "message": {"usage": {"input_tokens": 7}}}\n\n'
            b'data: {"type": "message_delta", "usage": {"output_tokens": 2}}\n\n',
            (7, 2),
        ),
        ("audio/mpeg", b"\xff\xfb", (None, None)),
    ],
)
def test_tokens_are_read_from_json_and_events(content_type: str, body: bytes, expected: tuple[int, int]) -> None:
    assert extract_tokens(content_type, body, b"") == expected


async def test_flush_writes_and_prune_forgets_old_requests(ctx: Context) -> None:
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    recorder = UsageRecorder(ctx, retention=timedelta(days=30))
    now = datetime.now(UTC)
    recorder.record(proxied(project.id, now - timedelta(days=31)))
    recorder.record(proxied(project.id, now, b'{"usage": {"prompt_tokens": 4, "completion_tokens": 1}}'))
    await recorder.flush()
    assert len(await usage.list_request_records(ctx, project_id=project.id)) == 2
    await recorder.prune()
    kept = await usage.list_request_records(ctx, project_id=project.id)
    assert [(record.prompt_tokens, record.completion_tokens) for record in kept] == [(4, 1)]


async def test_a_flush_under_way_when_the_recorder_stops_still_writes_its_batch(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway stopping (SIGTERM, a restart) cancels the recorder: the batch a flush has already taken must
    still reach the request log, or a restart would forget requests (and the budgets they spent)."""
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    writing, release = asyncio.Event(), asyncio.Event()
    insert = Repository.insert_request_records

    async def slow_insert(repo: Repository, rows: Sequence[RequestRow]) -> None:
        writing.set()
        await release.wait()
        await insert(repo, rows)

    monkeypatch.setattr(Repository, "insert_request_records", slow_insert)
    recorder = UsageRecorder(ctx, flush_seconds=0.01)
    for _ in range(2):
        recorder.record(proxied(project.id, datetime.now(UTC)))
    running = asyncio.create_task(recorder.run())
    await writing.wait()
    running.cancel()
    await asyncio.sleep(0.05)
    release.set()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    assert len(await usage.list_request_records(ctx, project_id=project.id)) == 2


async def test_every_field_is_stored_as_recorded_whatever_its_characters(ctx: Context) -> None:
    """On SQLite the batch travels as statements of 60 rows, the last padded with rows of NULLs that are left out
    (repository.insert_request_records): 502 records are 502 rows, and nothing of a value may be lost or changed on
    the way, not a microsecond, a quote, a backslash, a large count nor a None."""
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    recorder = UsageRecorder(ctx)
    at = datetime(2026, 11, 27, 0, 9, 59, 123456, tzinfo=UTC)
    odd = 'a"b\\c/é 日本 \u2028 \x7f'
    model = 'gpt-"4o"\\é'
    body = {"model": model, "usage": {"prompt_tokens": 4, "completion_tokens": 1}}
    full = proxied(project.id, at, json.dumps(body).encode())
    full.endpoint, full.subject, full.admitted, full.request_id = "v1/" + odd, odd, True, "req_full"
    full.duration_ms, full.request_bytes, full.response_bytes = 12.345, 2**40, 2**41
    bare = proxied(project.id, at + timedelta(microseconds=1), b"not json")
    bare.request_id, bare.status = "req_bare", 499
    many = [proxied(project.id, at - timedelta(seconds=index)) for index in range(1, 501)]
    for each in [full, bare, *many]:
        recorder.record(each)
    await recorder.flush()
    stored = await usage.list_request_records(ctx, project_id=project.id, limit=1000)
    assert len(stored) == 502
    newest, second = stored[0], stored[1]
    assert (second.request_id, second.at, second.endpoint, second.subject, second.model) == (
        "req_full",
        at,
        "v1/" + odd,
        odd,
        model,
    )
    assert (second.prompt_tokens, second.completion_tokens, second.admitted) == (4, 1, True)
    assert (second.duration_ms, second.request_bytes, second.response_bytes) == (12.345, 2**40, 2**41)
    assert (newest.request_id, newest.at, newest.status, newest.subject, newest.model) == (
        "req_bare",
        at + timedelta(microseconds=1),
        499,
        None,
        None,
    )
    assert (newest.prompt_tokens, newest.completion_tokens, newest.admitted) == (None, None, False)


def test_a_request_row_holds_the_request_logs_columns_in_the_tables_order() -> None:
    """On SQLite a row's values are bound by position (repository.insert_request_records)."""
    columns = tuple(column.name for column in RequestRecord.__table__.columns if column.name != "id")
    assert RequestRow._fields == columns


async def test_writing_no_records_is_no_statement(ctx: Context) -> None:
    """No records, no statement (the SQLite insert, padded to its rows a statement, failed on none)."""
    async with ctx.database.transaction() as repo:
        await repo.insert_request_records([])


async def test_a_full_backlog_drops_the_oldest_and_counts_them(ctx: Context) -> None:
    recorder = UsageRecorder(ctx, max_pending=2)
    before = REGISTRY.get_sample_value("credgate_request_records_dropped_total") or 0
    start = datetime.now(UTC)
    for index in range(3):
        recorder.record(proxied("prj_x", start + timedelta(seconds=index)))
    assert REGISTRY.get_sample_value("credgate_request_records_dropped_total") == before + 1  # operators see it
    kept = [pending.row.at for pending in recorder._pending]
    assert kept == [start + timedelta(seconds=1), start + timedelta(seconds=2)]  # the oldest went first


def _tokens_counted(project_id: str, kind: str) -> float:
    labels = {"project": project_id, "provider": "openai", "kind": kind}
    return REGISTRY.get_sample_value("credgate_tokens_total", labels) or 0


async def test_a_batch_counts_each_project_s_tokens_and_a_dropped_record_s_too(ctx: Context) -> None:
    """The tokens metric is counted once a batch for each project's provider, in sums (one call into
    prometheus-client, not two a request); a record dropped from a full backlog still counts its tokens."""
    project_a, project_b = f"prj_{secrets.token_hex(8)}", f"prj_{secrets.token_hex(8)}"  # apart from other tests
    recorder = UsageRecorder(ctx, max_pending=4)
    now = datetime.now(UTC)
    for project_id, prompt, completion in [(project_a, 4, 1), (project_b, 7, 0), (project_a, 5, 2), (project_a, 0, 3)]:
        body = json.dumps({"usage": {"prompt_tokens": prompt, "completion_tokens": completion}}).encode()
        recorder.record(proxied(project_id, now, body))
    recorder.record(proxied(project_b, now, b"not json"))  # no tokens; the backlog is full: (a, 4, 1) is dropped
    assert (_tokens_counted(project_a, "prompt"), _tokens_counted(project_a, "completion")) == (4, 1)
    await recorder.flush()
    assert (_tokens_counted(project_a, "prompt"), _tokens_counted(project_a, "completion")) == (9, 6)
    assert (_tokens_counted(project_b, "prompt"), _tokens_counted(project_b, "completion")) == (7, 0)


async def test_a_request_s_usage_is_read_as_it_is_recorded_not_kept_for_the_write(ctx: Context) -> None:
    """A pending request holds its row, not its body: the tokens are known (a trace's span may end) at once."""
    recorder = UsageRecorder(ctx, flush_seconds=3600)
    told: list[tuple[int | None, int | None]] = []
    request = proxied("prj_x", datetime.now(UTC), b'{"usage": {"prompt_tokens": 4, "completion_tokens": 1}}')
    request.on_tokens = lambda prompt, completion: told.append((prompt, completion))
    recorder.record(request)
    assert told == [(4, 1)]
    (pending,) = recorder._pending
    assert (pending.row.prompt_tokens, pending.row.completion_tokens) == (4, 1)
    assert not any(isinstance(value, bytes) for value in pending.row)


async def test_a_batch_is_written_once_it_is_full_without_waiting_for_the_clock(ctx: Context) -> None:
    """Under load the batch's size, not the clock, bounds a write (and what waits for it)."""
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    recorder = UsageRecorder(ctx, flush_seconds=3600, batch_size=3)
    running = asyncio.create_task(recorder.run())
    try:
        for _ in range(2):
            recorder.record(proxied(project.id, datetime.now(UTC)))
        await asyncio.sleep(0.2)
        assert await usage.list_request_records(ctx, project_id=project.id) == []  # not a batch yet
        recorder.record(proxied(project.id, datetime.now(UTC)))

        async def written() -> bool:
            return len(await usage.list_request_records(ctx, project_id=project.id)) == 3

        assert await eventually(written, within=10, every=0.02)  # not the hour of `flush_seconds`
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


def test_tokens_are_read_from_a_gzip_compressed_body() -> None:
    body = gzip.compress(b'{"usage": {"prompt_tokens": 11, "completion_tokens": 4}}')
    assert extract_tokens("application/json", body, b"", content_encoding="gzip") == (11, 4)


def test_tokens_are_read_from_the_end_of_a_body_too_long_to_keep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without parsing the head: 64 KiB of an embeddings answer's numbers took json.loads about a millisecond, only
    to fail on the cut."""
    head = b'{"data": [' + b"0.1," * 20_000  # cut off: not JSON on its own
    tail = b'0.2]}], "model": "m", "usage": {"prompt_tokens": 8, "total_tokens": 8}}'
    parsed: list[object] = []
    loads = json.loads

    def counted(text: str | bytes, **options: Any) -> Any:
        parsed.append(text)
        return loads(text, **options)

    monkeypatch.setattr(json, "loads", counted)
    assert extract_tokens("application/json", head, tail) == (8, None)
    assert parsed == []


EMBEDDING = (
    b'{"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [' + b"0.125," * 3000 + b"0.5]}]"
)


@pytest.mark.parametrize(
    ("ending", "expected", "spared"),
    [
        # An embeddings answer's own ending, and with a member after the usage.
        (b', "model": "emb-3", "usage": {"prompt_tokens": 8, "total_tokens": 8}}', (8, None, "emb-3"), True),
        (b', "model": "emb-3", "usage": {"prompt_tokens": 8}, "created": 1}', (8, None, "emb-3"), True),
        # Not the root's: nested, or overridden by a later key of the root's. The whole body is parsed instead.
        (
            b', "meta": {"model": "e", "usage": {"prompt_tokens": 99}}, "usage": {"prompt_tokens": 1}}',
            (1, None, None),
            False,
        ),
        (
            b', "model": "emb-3", "usage": {"prompt_tokens": 8}, "usage": {"prompt_tokens": 2}}',
            (2, None, "emb-3"),
            False,
        ),
        (b', "model": "emb-3", "usage": {"prompt_tokens": 8}, "model": "emb-4"}', (8, None, "emb-4"), False),
    ],
)
def test_a_long_whole_body_is_read_as_a_parse_of_it_would(
    ending: bytes, expected: tuple[int | None, int | None, str | None], spared: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From its closing `model` and `usage` alone when they are the root's (a parse of 18 KB of numbers spared);
    else by the parse."""
    body = EMBEDDING + ending
    assert usage._usage_of(json.loads(body)) == expected
    parsed: list[int] = []
    whole = usage._parsed

    def counted(document: bytes) -> object:
        parsed.append(len(document))
        return whole(document)

    monkeypatch.setattr(usage, "_parsed", counted)
    assert tuple(usage.extract_usage("application/json", body, b"")) == expected
    assert (len(body) in parsed) is not spared


def test_the_model_of_a_body_too_long_to_keep_is_read_where_it_is() -> None:
    """Near the start, or (an embeddings answer's) after the data, just before the usage: priced either way."""
    head = b'{"object": "list", "data": [{"object": "embedding", "embedding": [' + b"0.1," * 20_000
    tail = b'0.2]}], "model": "text-embedding-3-small", "usage": {"prompt_tokens": 8, "total_tokens": 8}}'
    assert tuple(usage.extract_usage("application/json", head, tail)) == (8, None, "text-embedding-3-small")
    named_first = b'{"model": "m-1", "data": [' + b"0.1," * 20_000
    assert usage.extract_usage("application/json", named_first, tail).model == "m-1"


def test_a_whole_body_followed_by_no_usage_is_still_parsed() -> None:
    """A body whose kept head is the whole document, and whose last chunk brings only white space."""
    head = b'{"model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 2}}'
    assert extract_tokens("application/json", head, b"\n") == (3, 2)


def test_capture_keeps_the_head_then_the_end_of_the_last_chunks_of_a_counted_body() -> None:
    record = proxied("p", datetime.now(UTC), body=b"")
    record.head.clear()
    record.start_response(200, "text/event-stream; charset=utf-8", "")
    chunks = [bytes([65 + index % 26]) * 10_000 for index in range(20)]
    for chunk in chunks:
        record.capture(chunk)
    assert record.response_bytes == 200_000
    assert record.head == chunks[:7]  # whole chunks until 64 KiB are kept
    assert record.tail is not None
    assert list(record.tail) == [chunk[-usage.TAIL_CHUNK_BYTES :] for chunk in chunks[7:]][-16:]


def test_capture_only_counts_a_body_whose_usage_is_not_read() -> None:
    record = proxied("p", datetime.now(UTC), body=b"")
    record.head.clear()
    record.start_response(200, "audio/mpeg", "")
    record.capture(b"x" * 1000)
    assert record.response_bytes == 1000
    assert record.head == []
    assert not record.tail


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b'{"model": "gpt-4o-2024-08-06", "usage": {"prompt_tokens": 9, "completion_tokens": 3}}',
            (9, 3, "gpt-4o-2024-08-06"),
        ),
        (b'{"model": "a\\u0000b", "usage": {"prompt_tokens": 1}}', (1, None, None)),  # a NUL is no model name
        (b'{"model": "\\ud800", "usage": {"prompt_tokens": 1}}', (1, None, None)),  # nor a lone surrogate
        (b'{"model": 42, "usage": {"prompt_tokens": -5, "completion_tokens": true}}', (None, None, None)),
        (b'{"usage": {"prompt_tokens": 2147483648, "completion_tokens": 1' + b"0" * 400 + b"}}", (None, None, None)),
        (b'{"model": "' + b"m" * 300 + b'"}', (None, None, "m" * 200)),
        (b'{"usage": {"prompt_tokens": 1' + b"0" * 30 + b', "completion_tokens": 1.0}}', (None, None, None)),
    ],
)
def test_the_model_and_counts_are_taken_only_when_they_are_what_they_claim(
    body: bytes, expected: tuple[int | None, int | None, str | None]
) -> None:
    assert tuple(usage.extract_usage("application/json", body, b"")) == expected


def test_a_stream_names_its_model_and_its_usage_in_different_events() -> None:
    events = (
        b'event: message_start\ndata: {"type": "message_start", "message": {"model": "claude-3-5-haiku", '
        b'"usage": {"input_tokens": 12, "output_tokens": 1}}}\n\n'
        b'event: message_delta\ndata: {"type": "message_delta", "usage": {"output_tokens": 30}}\n\n'
    )
    assert tuple(usage.extract_usage("text/event-stream", events, b"")) == (12, 30, "claude-3-5-haiku")


async def test_sqlite_s_log_is_copied_into_the_database_file_by_a_task_of_its_own(tmp_path: Path) -> None:
    """Not by the commit that finds the write-ahead log over 1,000 pages: under load that was the request log's
    write, stalled for up to 0.8 s while requests' records piled up in memory."""
    ctx = await open_context(Settings(data_dir=tmp_path / "data"))
    try:
        project, _ = await projects.create_project(ctx, name="p", actor="t")
        database_file = tmp_path / "data" / "credgate.db"
        before = database_file.stat().st_size
        recorder = UsageRecorder(ctx)
        for _ in range(20_000):  # over 1,000 pages of log
            recorder.record(proxied(project.id, datetime.now(UTC)))
        await recorder.flush()
        log = database_file.with_name("credgate.db-wal").stat().st_size
        assert log > 1000 * 4096
        assert database_file.stat().st_size == before  # the rows are in the log only
        copying = asyncio.create_task(ctx.database.checkpoint_wal(every=0.01))
        try:
            assert await eventually(lambda: database_file.stat().st_size > before + 1000 * 4096, within=10)
        finally:
            copying.cancel()
            await asyncio.gather(copying, return_exceptions=True)
    finally:
        await ctx.database.dispose()


@pytest.mark.parametrize(
    "document",
    [
        b'{"model": "gpt-4o", "usage": {"prompt_tokens": 9, "completion_tokens": 3}}',
        b' \r\n{"usage": {"input_tokens": 7}}\r\n',  # an event's data after "data:", and CRLF lines
        b'{"usage": {"prompt_tokens": NaN, "completion_tokens": Infinity}}',  # json reads these; orjson does not
        b'{"model": "\\ud800"}',  # a lone surrogate
        '{"model": "é", "usage": {"prompt_tokens": 4}}'.encode("utf-16"),
        '{"model": "名前"}'.encode(),
    ],
)
def test_a_document_is_read_as_json_reads_it(document: bytes) -> None:
    assert repr(usage._parsed(document)) == repr(json.loads(document))


def test_a_document_json_cannot_read_is_refused_as_json_refuses_it() -> None:
    for document in (b"not json", b"[DONE]", b'{"usage": {'):
        with pytest.raises(json.JSONDecodeError):
            usage._parsed(document)


def test_a_plain_answer_and_its_events_are_read_without_json(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(document: object) -> object:
        raise AssertionError("read by json")

    monkeypatch.setattr(json, "loads", refused)
    body = b'{"model": "gpt-4o", "usage": {"prompt_tokens": 9, "completion_tokens": 3}}'
    assert tuple(usage.extract_usage("application/json", body, b"")) == (9, 3, "gpt-4o")
    events = b'data: {"model": "gpt-4o"}\r\n\r\ndata: {"usage": {"prompt_tokens": 5, "completion_tokens": 2}}\r\n\r\n'
    assert tuple(usage.extract_usage("text/event-stream", events, b"")) == (5, 2, "gpt-4o")


def _every_event_read(head: bytes, tail: bytes) -> usage.Usage:
    """The reference: each event of the stream parsed in turn (what the recorder did before it read only those
    that name a usage or a model)."""
    found = usage.Usage()
    for chunk in (head, tail):
        for line in chunk.split(b"\n"):
            if line.startswith(b"data:"):
                try:
                    found = found.over(usage._usage_of(json.loads(line[5:])))
                except ValueError:
                    continue
    return found


_EVENTS = [
    b'data: {"model": "gpt-4o-mini", "choices": [{"delta": {"content": "Hi"}}]}',
    b'data: {"model": "gpt-4o", "choices": [{"delta": {"content": "the \\"usage\\" of \\"model\\""}}]}',
    b'data: {"model": "gpt-4o-mini", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 40}}',
    b'data: {"model": "a\\u0000b", "usage": {"prompt_tokens": 3}}',  # no model name: a NUL
    b'data: {"model": "", "choices": []}',
    b'data: {"model": 42}',
    b'data: {"type": "message_start", "message": {"model": "claude-3-5-haiku", "usage": {"input_tokens": 9}}}',
    b'data: {"type": "content_block_delta", "delta": {"text": "words"}}',
    b'data: {"type": "message_delta", "usage": {"output_tokens": 30}}',
    b'data: {"usage": null, "model": "m2"}',
    b'data: {"usage": {"prompt_tokens": 1.5, "completion_tokens": -1}}',
    b'data: {"usage": {"prompt_tokens": 7}',  # cut short
    b"data: [DONE]",
    b'data:{"model":"tight","usage":{"completion_tokens":5}}',
    b"event: message_delta",
    b': a comment naming "usage" and "model"',
    b"",
    b'data: ["model", "usage"]',
    b'data: "usage"',
    b'data: {"model": "gpt-4o", "choices": [], "usage": null}',  # OpenAI's, asked for usage in the stream
    b'data: {"usage" : null, "message": {"usage": {"input_tokens": 4}}}',  # a null usage, then a real one
    b'data: {"message": {"usage": null}, "usage":null, "model": "m3"}',
    b'data: {"usage": nullx}',
    b'data: {"usage": {"prompt_tokens": 5, "completion_tokens": 6}, "choices": null}',  # null, but not its usage
]


@pytest.mark.parametrize("seed", range(300))
def test_a_stream_reads_as_if_every_event_were_read(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - streams made up for a test, not a secret
    lines = [rng.choice(_EVENTS) for _ in range(rng.randint(0, 12))]
    body = b"".join(line + rng.choice([b"\n", b"\n\n", b"\r\n\r\n", b"\r\n"]) for line in lines)
    cut = rng.randint(0, len(body))  # the tail starts anywhere, mid-line too
    head, tail = body[:cut], body[cut:] if rng.random() < 0.5 else b""
    expected = _every_event_read(head, tail)
    assert usage.extract_usage("text/event-stream", head, tail) == expected


def test_a_long_stream_parses_only_the_events_that_name_a_usage_or_a_model_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As OpenAI streams when asked for usage in the stream: a null usage in every event but the last.
    delta = b'data: {"model": "gpt-4o-mini", "choices": [{"delta": {"content": "word "}}], "usage": null}\n\n'
    closing = b'data: {"model": "gpt-4o-mini", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 400}}'
    body = delta * 400 + closing + b"\n\ndata: [DONE]\n\n"
    parsed: list[bytes] = []
    whole = usage._parsed

    def counted(document: bytes) -> object:
        parsed.append(document)
        return whole(document)

    monkeypatch.setattr(usage, "_parsed", counted)
    assert tuple(usage.extract_usage("text/event-stream", body, b"")) == (12, 400, "gpt-4o-mini")
    assert len(parsed) == 2  # the usage event, forwards, then backwards, for its model
