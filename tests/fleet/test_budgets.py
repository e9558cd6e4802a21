"""Budget counters through a real Redis: one count for every process, started from the request log, and per
process (started again from the request log) while Redis is away."""

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from credgate.fleet import Fleet, open_fleet
from credgate.fleet.budgets import LocalBudgets, SharedBudgets
from credgate.fleet.fleet import RETRY_SECONDS
from credgate.spending import BudgetRule
from tests.redis_server import calls_sent, private_redis, unique_namespace

AT = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
REQUESTS = BudgetRule(id="bud_requests", metric="requests", period="day", amount=50)
TOKENS = BudgetRule(id="bud_tokens", metric="tokens", period="month", amount=1000)


class RequestLog:
    """A stand-in for the request log's sums: what each budget had spent before, and how often it was asked."""

    def __init__(self, **spent: int) -> None:
        self.spent = spent
        self.asked: list[tuple[str, datetime]] = []

    async def __call__(self, project_id: str, rule: BudgetRule, since: datetime) -> int:
        self.asked.append((rule.id, since))
        await asyncio.sleep(0.01)  # a query: requests arriving meanwhile must wait for it, not ask again
        return self.spent.get(rule.id, 0)


def shared(fleets: list[Fleet], log: RequestLog) -> list[SharedBudgets]:
    return [SharedBudgets(fleet, LocalBudgets(log), log) for fleet in fleets]


async def test_three_processes_asking_at_once_admit_exactly_the_budget_starting_from_the_request_log(
    fleets: list[Fleet],
) -> None:
    log = RequestLog(bud_requests=10)  # 10 spent before any process started
    counters = shared(fleets, log)

    answers = await asyncio.gather(*(counters[turn % 3].admit("p1", [REQUESTS], AT) for turn in range(200)))

    assert answers.count(None) == 40
    assert set(answers) == {None, REQUESTS}
    assert {since for _, since in log.asked} == {datetime(2026, 11, 26, tzinfo=UTC)}
    assert len(log.asked) <= 3  # seeded once (a process or two may race to it; only the first one counts)
    # The next day is a new period: a new counter, from the request log again.
    assert await counters[0].admit("p1", [REQUESTS], datetime(2026, 11, 27, 0, 0, 1, tzinfo=UTC)) is None


async def test_tokens_are_admitted_while_under_the_budget_and_settled_after(fleets: list[Fleet]) -> None:
    counters = shared(fleets, RequestLog(bud_tokens=900))

    assert await counters[0].admit("p1", [TOKENS, REQUESTS], AT) is None
    counters[1].settle([(TOKENS, AT, 99)])
    await asyncio.sleep(0.1)
    assert await counters[2].admit("p1", [TOKENS], AT) is None  # 999 of 1000
    counters[2].settle([(TOKENS, AT, 5)])
    await asyncio.sleep(0.1)
    assert await counters[0].admit("p1", [REQUESTS, TOKENS], AT) is TOKENS  # 1004: spent
    # A refusal counts nothing: the requests budget still holds only the first request.
    assert await fleets[0].redis.get(fleets[0].key("budget", REQUESTS.counter(AT))) == b"1"


async def test_the_admissions_of_one_turn_share_one_round_trip_and_are_judged_in_order(tmp_path: Path) -> None:
    with private_redis(tmp_path) as redis:  # its own: the machine's Redis counts every test's calls
        fleet = open_fleet(redis.url, namespace=unique_namespace())
        try:
            counters = SharedBudgets(fleet, LocalBudgets(RequestLog()), RequestLog())
            for rule in (REQUESTS, TOKENS):  # both counters seeded
                assert await counters.admit("p1", [rule], AT) is None
            before = await script_calls(fleet)

            answers = await asyncio.gather(*(counters.admit("p1", [REQUESTS, TOKENS], AT) for _ in range(60)))

            assert await script_calls(fleet) - before == 1
            assert answers == [None] * 49 + [REQUESTS] * 11  # 50 in all, the first included, in order
        finally:
            await fleet.close()


async def test_a_turn_names_each_counter_once_and_judges_each_admission_by_its_own_budgets(
    fleets: list[Fleet],
) -> None:
    held = BudgetRule(id="bud_held", metric="tokens", period="month", amount=1000, reserve=300)
    daily = BudgetRule(id="bud_daily", metric="requests", period="day", amount=2)
    counters = SharedBudgets(fleets[0], LocalBudgets(RequestLog()), RequestLog())
    for project, rules in (("p1", [REQUESTS, held]), ("p2", [daily])):  # seeded: each holds one admission
        assert await counters.admit(project, rules, AT) is None
    sent = calls_sent(counters, "_admit")

    answers = await asyncio.gather(
        *(counters.admit(*(("p1", [REQUESTS, held]) if turn % 3 else ("p2", [daily])), AT) for turn in range(9))
    )

    assert sent == [(3, 9)]  # three counters, named once for nine admissions
    # p1: 300 held, then room for two more reserves of 300 (the third would make 1200); p2: room for one more.
    assert answers == [None, None, None, daily, held, held, daily, held, held]
    values = [fleets[1].redis.get(fleets[1].key("budget", rule.counter(AT))) for rule in (REQUESTS, held, daily)]
    assert await asyncio.gather(*values) == [b"3", b"900", b"2"]  # a refused admission adds to none of its budgets


async def test_a_batch_of_settlements_adds_each_counters_sum_in_one_argument(fleets: list[Fleet]) -> None:
    held = BudgetRule(id="bud_held", metric="tokens", period="month", amount=10**6, reserve=300)
    counters = SharedBudgets(fleets[0], LocalBudgets(RequestLog()), RequestLog())
    for rule in (TOKENS, held):
        assert await counters.admit("p1", [rule], AT) is None  # seeded: 0, and 300 held
    sent = calls_sent(counters, "_settle")
    # A response that spent less than its reserve gives some back: charges may be negative.
    counters.settle([(TOKENS, AT, 3), (held, AT, -120)] * 100 + [(held, AT, 50)])
    await asyncio.sleep(0.1)

    assert sent == [(2, 2)]
    values = [fleets[1].redis.get(fleets[1].key("budget", rule.counter(AT))) for rule in (TOKENS, held)]
    assert await asyncio.gather(*values) == [b"300", str(300 - 12_000 + 50).encode()]


async def script_calls(fleet: Fleet) -> int:
    stats = await fleet.redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))


async def test_without_redis_budgets_count_per_process_from_the_request_log_and_are_shared_again_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="credgate.fleet.budgets")
    log = RequestLog(bud_requests=47)
    with private_redis(tmp_path) as redis:
        fleet = open_fleet(redis.url, namespace=unique_namespace())
        counters = SharedBudgets(fleet, LocalBudgets(log), log)
        try:
            assert await counters.admit("p1", [REQUESTS], AT) is None  # 48, in Redis
            redis.stop()
            # Redis is gone: counted here, from the request log (which says 47 and is behind): 48, 49, 50, spent.
            answers = [await counters.admit("p1", [REQUESTS], AT) for _ in range(4)]
            assert answers == [None, None, None, REQUESTS]
            downs = [record for record in caplog.records if "budgets are counted per process" in record.message]
            assert len(downs) == 1
            redis.start()
            await asyncio.sleep(RETRY_SECONDS + 0.1)
            assert await counters.admit("p1", [REQUESTS], AT) is None  # back in Redis, which held 48
            assert "budgets are shared again" in caplog.text
        finally:
            await fleet.close()


async def test_what_a_process_counted_alone_while_redis_hung_is_added_to_the_shared_count_when_it_answers(
    tmp_path: Path,
) -> None:
    log = RequestLog(bud_requests=47)  # the request log, behind: it does not hold the requests in Redis yet
    with private_redis(tmp_path) as redis:
        fleet = open_fleet(redis.url, namespace=unique_namespace())
        counters = SharedBudgets(fleet, LocalBudgets(log), log)
        try:
            assert await counters.admit("p1", [REQUESTS], AT) is None  # 48, in Redis
            redis.pause()  # hung, its counter kept
            assert await counters.admit("p1", [REQUESTS], AT) is None  # counted here: 48 by the log
            assert await counters.admit("p1", [REQUESTS], AT) is None  # 49 here
            redis.resume()
            await asyncio.sleep(RETRY_SECONDS + 0.1)
            # Redis held 48, and counted the admission whose answer the timeout lost when it woke (49); the two
            # counted here are added on its return: 51, spent. A lost answer overcounts; nothing undercounts.
            assert await counters.admit("p1", [REQUESTS], AT) is REQUESTS
            assert await fleet.redis.get(fleet.key("budget", REQUESTS.counter(AT))) == b"51"
        finally:
            redis.resume()
            await fleet.close()
