"""Prices and budget periods, pure: the first matching price line, costs in whole micro-dollars rounded up, UTC
calendar periods whose counters never collide."""

import random
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from credgate.spending import BudgetRule, Price, cost_micros, price_of

PRICES = (Price("gpt-4o-mini*", 0.15, 0.6), Price("gpt-4o*", 2.5, 10.0), Price("*", 1.0, 1.0))


def test_the_first_matching_line_prices_a_model_and_an_unknown_model_only_matches_a_catch_all() -> None:
    assert price_of(PRICES, "gpt-4o-mini-2024-07-18") == PRICES[0]
    assert price_of(PRICES, "gpt-4o-2024-08-06") == PRICES[1]
    assert price_of(PRICES, None) == PRICES[2]
    assert price_of(PRICES[:2], "claude-3-5-haiku") is None
    assert price_of(PRICES[:2], "GPT-4O") is None  # model names are matched as written


def test_a_cost_is_whole_micro_dollars_rounded_up_and_none_without_tokens_or_a_price() -> None:
    assert cost_micros(PRICES, "gpt-4o", 1000, 100) == 3500  # 1000 × 2.5 + 100 × 10
    assert cost_micros(PRICES, "gpt-4o-mini", 1, 1) == 1  # 0.75 µ$, rounded up
    assert cost_micros(PRICES, "gpt-4o", None, 7) == 70
    assert cost_micros(PRICES, "gpt-4o", None, None) is None
    assert cost_micros(PRICES[:2], "other", 10, 10) is None


def test_periods_are_utc_calendar_days_and_months_and_their_counters_never_collide() -> None:
    daily = BudgetRule("bud_x", "requests", "day", 10)
    monthly = BudgetRule("bud_x", "requests", "month", 10)
    late = datetime(2026, 12, 31, 23, 30, tzinfo=timezone(timedelta(hours=-5)))  # already 1 January in UTC
    assert daily.window(late) == (datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 1, 2, tzinfo=UTC))
    assert monthly.window(late) == (datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 2, 1, tzinfo=UTC))
    december = datetime(2026, 12, 15, tzinfo=UTC)
    assert monthly.window(december)[1] == datetime(2027, 1, 1, tzinfo=UTC)
    first = datetime(2026, 5, 1, 8, tzinfo=UTC)
    assert daily.counter(first) != monthly.counter(first)  # the same start, another period
    assert daily.counter(first) != daily.counter(first + timedelta(days=1))
    assert monthly.counter(first) == monthly.counter(first + timedelta(days=20))


def test_a_counter_is_named_after_its_windows_start_as_every_version_of_the_gateway_names_it() -> None:
    """Workers and instances of several versions count in the same Redis keys: the name must not change."""
    daily = BudgetRule("bud_x", "tokens", "day", 10)
    monthly = BudgetRule("bud_x", "tokens", "month", 10, per_subject=True).for_subject("user-42")
    late = datetime(2026, 12, 31, 23, 30, tzinfo=timezone(timedelta(hours=-5)))
    assert daily.counter(late) == "bud_x:day:2027-01-01"
    assert monthly.counter(late) == "bud_x:month:2027-01-01:e7e636470e1230e25d107d62"
    moments = random.Random(7)  # noqa: S311 - moments made up for a test, not a secret
    zones = (UTC, ZoneInfo("Europe/Paris"), ZoneInfo("Pacific/Kiritimati"), timezone(timedelta(hours=-11)))
    for _ in range(2_000):
        at = datetime.fromtimestamp(moments.uniform(0, 4_200_000_000), moments.choice(zones))
        for rule in (daily, monthly):
            named = rule.counter(at) if rule.subject is None else rule.counter(at).rpartition(":")[0]
            assert named == f"{rule.id}:{rule.period}:{rule.window(at)[0]:%Y-%m-%d}", at


def test_a_budget_describes_itself_and_charges_what_its_metric_counts() -> None:
    cost = BudgetRule("bud_c", "cost", "month", 25_000_000)
    tokens = BudgetRule("bud_t", "tokens", "day", 1_000_000)
    requests = BudgetRule("bud_r", "requests", "day", 5, provider="openai")
    assert (cost.describe(), tokens.describe(), requests.describe()) == (
        "$25.00 a month",
        "1,000,000 tokens a day",
        "5 requests a day",
    )
    assert (cost.charge(10, 5, 1234), tokens.charge(10, None, 1234), requests.charge(10, 5, 1234)) == (1234, 10, 0)
    assert requests.applies_to("openai")
    assert not requests.applies_to("anthropic")
    assert cost.applies_to("anything")
