"""What a request costs and which period it counts in: price lists, budget rules and their calendar periods.

Pure: the services validate and store these, the proxy admits and settles by them. Costs are whole micro-dollars
(a price per million tokens times tokens is micro-dollars exactly), so counters stay integers everywhere.
"""

import hashlib
import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from typing import Literal

Metric = Literal["requests", "tokens", "cost"]
Period = Literal["day", "month"]
METRICS: tuple[Metric, ...] = ("requests", "tokens", "cost")
PERIODS: tuple[Period, ...] = ("day", "month")
MICROS_PER_DOLLAR = 1_000_000


@dataclass(frozen=True, slots=True)
class Price:
    """One line of a price list: models matching `model` (a glob: `gpt-4o*`) cost so many dollars per million
    input and output tokens."""

    model: str
    input: float
    output: float


def price_of(prices: tuple[Price, ...], model: str | None) -> Price | None:
    """The first line of the list that matches `model` (an unknown model is matched as "")."""
    name = model or ""
    return next((price for price in prices if fnmatchcase(name, price.model)), None)


def cost_micros(prices: tuple[Price, ...], model: str | None, prompt: int | None, completion: int | None) -> int | None:
    """A response's cost in micro-dollars, rounded up; None when no line prices its model, or it reported no
    tokens."""
    price = price_of(prices, model)
    if price is None or (prompt is None and completion is None):
        return None
    return math.ceil((prompt or 0) * price.input + (completion or 0) * price.output)


@dataclass(frozen=True, slots=True)
class BudgetRule:
    """A budget as the proxy enforces it: at most `amount` of `metric` per `period`, for one provider or all."""

    id: str
    metric: Metric
    period: Period
    amount: int  # cost: micro-dollars
    provider: str | None = None
    reserve: int = 0  # tokens or micro-dollars held per request from admission until its usage is settled
    per_subject: bool = False  # counted for each end user apart (`for_subject`)
    subject: str | None = None  # the end user this rule counts, once bound

    def for_subject(self, subject: str) -> "BudgetRule":
        """This per-subject rule as it applies to one end user: a counter of its own."""
        return replace(self, subject=subject)

    @property
    def admission(self) -> int:
        """What admitting a request adds at once: the request itself, or the reserve held for its usage."""
        return 1 if self.metric == "requests" else self.reserve

    def applies_to(self, provider: str) -> bool:
        return self.provider is None or self.provider == provider

    def window(self, at: datetime) -> tuple[datetime, datetime]:
        """The period `at` falls in: its start and its end (the next one's start), UTC calendar days or months."""
        at = at.astimezone(UTC)
        if self.period == "day":
            start = datetime(at.year, at.month, at.day, tzinfo=UTC)
            return start, start + timedelta(days=1)
        start = datetime(at.year, at.month, 1, tzinfo=UTC)
        return start, datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)

    def counter(self, at: datetime) -> str:
        """The name of this budget's counter for the period of `at`: a new period is a new counter."""
        at = at.astimezone(UTC)
        # The window's start, written out without strftime: names a counter for every budget of every request, in
        # 0.6 µs instead of 2.6. A day and its month start alike: the period tells.
        name = f"{self.id}:{self.period}:{at.year:04}-{at.month:02}-{at.day if self.period == 'day' else 1:02}"
        if self.subject is None:
            return name
        # A subject is the app's text: a digest keeps every counter's name short and plain.
        return f"{name}:{hashlib.blake2b(self.subject.encode(), digest_size=12).hexdigest()}"

    def describe(self) -> str:
        """The budget in words, for the 402 message: "$5.00 a month", "1000 requests a day"."""
        each = " for each end user" if self.per_subject else ""
        if self.metric == "cost":
            return f"${self.amount / MICROS_PER_DOLLAR:,.2f} a {self.period}{each}"
        return f"{self.amount:,} {self.metric} a {self.period}{each}"

    def charge(self, prompt: int | None, completion: int | None, cost: int | None) -> int:
        """What a settled response adds to this budget: its usage less the reserve its admission held (negative
        when it spent less); a request was counted when it was admitted."""
        if self.metric == "tokens":
            return (prompt or 0) + (completion or 0) - self.reserve
        if self.metric == "cost":
            return (cost or 0) - self.reserve
        return 0


def rules_for(rules: tuple[BudgetRule, ...], subject: str | None) -> tuple[BudgetRule, ...]:
    """The rules that count a request of `subject`: the project's, and each per-subject one bound to the subject
    (a request without a subject, made with the project token itself, is not an end user's)."""
    if not any(rule.per_subject for rule in rules):
        return rules
    if subject is None:
        return tuple(rule for rule in rules if not rule.per_subject)
    return tuple(rule.for_subject(subject) if rule.per_subject else rule for rule in rules)


Charge = tuple[BudgetRule, datetime, int]
"""A budget, the time of the request it settles (its period), and the amount to add."""
