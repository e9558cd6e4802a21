"""Budgets and price lists: what a project may spend per day or month, and what its responses cost.

A budget counts requests, tokens or cost, of one provider or all; the proxy admits by it and settles what each
response spent (fleet/budgets.py). What a budget has spent is read back from the request log, which is also where
a counter starts from after a restart. Every change is audited and reaches every worker and instance.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from credgate.errors import Conflict, InvalidInput, NotFound
from credgate.services.context import Context, new_id, plausible_id
from credgate.services.integrations import require_integration
from credgate.services.projects import require_project
from credgate.spending import METRICS, MICROS_PER_DOLLAR, PERIODS, BudgetRule, Metric, Period, Price
from credgate.storage import Repository
from credgate.storage.models import Budget, Integration

MAX_BUDGETS_PER_PROJECT = 50
MAX_PRICES = 200  # lines of one integration's price list
MAX_MODEL_PATTERN_LENGTH = 200
MAX_COUNT = 10**15  # requests or tokens in a period
MAX_DOLLARS = 10**9  # a cost budget, and a price per million tokens


def rule_of(budget: Budget) -> BudgetRule:
    return BudgetRule(
        id=budget.id,
        metric=cast(Metric, budget.metric),
        period=cast(Period, budget.period),
        amount=budget.amount,
        provider=budget.provider,
        reserve=budget.reserve,
        per_subject=budget.per_subject,
    )


def prices_of(integration: Integration) -> tuple[Price, ...]:
    return tuple(Price(line["model"], float(line["input"]), float(line["output"])) for line in integration.prices)


def _whole(value: object) -> object:
    """A count typed as a number (3.0 from a form or an option) as the whole number it is; anything else as is,
    for the caller to judge."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _amount(metric: str, limit: object) -> int:
    """A limit as stored: a whole number of requests or tokens, or dollars (to the cent) as micro-dollars."""
    if metric == "cost":
        if isinstance(limit, bool) or not isinstance(limit, int | float) or not math.isfinite(limit):
            raise InvalidInput("limit", "must be a number of dollars")
        if not 0.01 <= limit <= MAX_DOLLARS:
            raise InvalidInput("limit", f"must be from 0.01 to {MAX_DOLLARS:,} dollars")
        return round(limit * MICROS_PER_DOLLAR)
    limit = _whole(limit)
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidInput("limit", f"must be a whole number of {metric}")
    if not 1 <= limit <= MAX_COUNT:
        raise InvalidInput("limit", f"must be from 1 to {MAX_COUNT:,}")
    return limit


def _reserve(metric: str, reserve: object, amount: int) -> int:
    """A reserve per request as stored: tokens, or dollars as micro-dollars; never more than the limit."""
    if reserve is None or reserve == 0:
        return 0
    if metric == "requests":
        raise InvalidInput("reserve", "is for tokens and cost budgets: a request is counted when it is admitted")
    if isinstance(reserve, bool) or not isinstance(reserve, int | float) or not math.isfinite(reserve) or reserve < 0:
        raise InvalidInput("reserve", "must be a number, 0 or more")
    if metric == "tokens" and not isinstance(_whole(reserve), int):
        raise InvalidInput("reserve", "must be a whole number of tokens")
    stored = round(reserve * MICROS_PER_DOLLAR) if metric == "cost" else int(reserve)
    if stored > amount:
        raise InvalidInput("reserve", "must not be more than the limit")
    return stored


def reserve_of(budget: Budget) -> float | int:
    """The reserve as the API shows it: dollars for cost, else tokens."""
    return budget.reserve / MICROS_PER_DOLLAR if budget.metric == "cost" else budget.reserve


def limit_of(budget: Budget) -> float | int:
    """The limit as the API shows it: dollars for cost, else a count."""
    return budget.amount / MICROS_PER_DOLLAR if budget.metric == "cost" else budget.amount


def _thresholds(thresholds: Sequence[object]) -> list[int]:
    """Percentages of the limit whose crossing raises an event: whole numbers from 1 to 100, at most 10."""
    if len(thresholds) > 10 or any(
        isinstance(each, bool) or not isinstance(each, int) or not 1 <= each <= 100 for each in thresholds
    ):
        raise InvalidInput("thresholds", "must be at most 10 whole percentages from 1 to 100")
    return sorted({int(cast(int, each)) for each in thresholds})


def _period(period: str) -> str:
    if period not in PERIODS:
        raise InvalidInput("period", "must be day or month")
    return period


async def _require_budget(repo: Repository, project_id: str, budget_id: str) -> Budget:
    await require_project(repo, project_id)
    budget = await repo.get_budget(project_id, budget_id) if plausible_id(budget_id) else None
    if budget is None:
        raise NotFound("no such budget")
    return budget


async def add_budget(
    ctx: Context,
    *,
    project_id: str,
    metric: str,
    limit: object,
    period: str,
    provider: str | None = None,
    thresholds: Sequence[object] = (80, 100),
    reserve: object = None,
    per_subject: bool = False,
    actor: str,
) -> Budget:
    """A budget; an event is raised when its spend crosses each of `thresholds` (percentages of the limit). A
    tokens or cost budget may hold `reserve` (tokens, or dollars) per request from admission to settlement, so
    that calls in flight cannot together spend past it by more than what each spends over its reserve.
    `per_subject`: the limit holds for each end user (a client or identity token's subject) apart."""
    if metric not in METRICS:
        raise InvalidInput("metric", "must be requests, tokens or cost")
    amount, period, alerts = _amount(metric, limit), _period(period), _thresholds(thresholds)
    held = _reserve(metric, reserve, amount)
    async with ctx.change(actor=actor, action="budget.add", project_id=project_id, provider=provider) as repo:
        await require_project(repo, project_id)
        if provider is not None:
            await require_integration(repo, project_id, provider)  # a budget that could never apply is a typo
        if len(await repo.list_budgets(project_id)) >= MAX_BUDGETS_PER_PROJECT:
            raise Conflict(f"project {project_id} already has {MAX_BUDGETS_PER_PROJECT} budgets, the most it may")
        now = ctx.clock()
        budget = Budget(
            id=new_id("bud"),
            project_id=project_id,
            provider=provider,
            metric=metric,
            period=period,
            amount=amount,
            reserve=held,
            thresholds=alerts,
            per_subject=per_subject is True,
            created_at=now,
            updated_at=now,
        )
        repo.add(budget)
    return budget


async def update_budget(
    ctx: Context,
    *,
    project_id: str,
    budget_id: str,
    limit: object = None,
    period: str | None = None,
    thresholds: Sequence[object] | None = None,
    reserve: object = None,
    actor: str,
) -> Budget:
    """A new limit, period or thresholds (None leaves it); the spend of the period so far counts against the new
    limit."""
    alerts = None if thresholds is None else _thresholds(thresholds)
    async with ctx.change(actor=actor, action="budget.update", project_id=project_id) as repo:
        budget = await _require_budget(repo, project_id, budget_id)
        if limit is not None:
            budget.amount = _amount(budget.metric, limit)
        if period is not None:
            budget.period = _period(period)
        if alerts is not None:
            budget.thresholds = alerts
        if reserve is not None:
            budget.reserve = _reserve(budget.metric, reserve, budget.amount)
        elif budget.reserve > budget.amount:
            raise InvalidInput("limit", "must not be less than the reserve per request")
        budget.updated_at = ctx.clock()
    return budget


async def remove_budget(ctx: Context, *, project_id: str, budget_id: str, actor: str) -> None:
    async with ctx.change(actor=actor, action="budget.remove", project_id=project_id) as repo:
        await repo.delete(await _require_budget(repo, project_id, budget_id))


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A budget and where it stands in its current period (spent as the request log says)."""

    budget: Budget
    spent: int  # in the stored unit (cost: micro-dollars)
    period_start: datetime
    resets_at: datetime


async def list_budgets(ctx: Context, *, project_id: str) -> list[BudgetState]:
    now = ctx.clock()
    async with ctx.database.transaction(write=False) as repo:
        await require_project(repo, project_id)
        states = []
        for budget in await repo.list_budgets(project_id):
            start, end = rule_of(budget).window(now)
            spent = await repo.spent(
                project_id,
                metric=budget.metric,
                provider=budget.provider,
                since=start,
                busiest_subject=budget.per_subject,
            )
            states.append(BudgetState(budget, spent, start, end))
    return states


async def spent_since(ctx: Context, project_id: str, rule: BudgetRule, since: datetime) -> int:
    """What a budget has spent since `since`, from the request log: where its counters start from (a `Seed`)."""
    async with ctx.database.transaction(write=False) as repo:
        return await repo.spent(
            project_id, metric=rule.metric, provider=rule.provider, since=since, subject=rule.subject
        )


def _price_line(index: int, line: object) -> dict[str, Any]:
    field = f"prices[{index + 1}]"
    if not isinstance(line, dict) or set(line) != {"model", "input", "output"}:
        raise InvalidInput(field, "must be {model, input, output}")
    model = line["model"]
    if not isinstance(model, str) or not 1 <= len(model) <= MAX_MODEL_PATTERN_LENGTH or not model.isprintable():
        raise InvalidInput(f"{field}.model", f"must be a model or glob of 1 to {MAX_MODEL_PATTERN_LENGTH} characters")
    checked: dict[str, Any] = {"model": model}
    for side in ("input", "output"):
        price = line[side]
        if isinstance(price, bool) or not isinstance(price, int | float) or not math.isfinite(price):
            raise InvalidInput(f"{field}.{side}", "must be a number of dollars per million tokens")
        if not 0 <= price <= MAX_DOLLARS:
            raise InvalidInput(f"{field}.{side}", f"must be from 0 to {MAX_DOLLARS:,} dollars per million tokens")
        checked[side] = float(price)
    return checked


async def set_prices(
    ctx: Context, *, project_id: str, provider: str, prices: Sequence[object], actor: str
) -> Integration:
    """Replace an integration's price list: lines of {model (a glob such as `gpt-4o*`), input, output}, dollars
    per million tokens, the first matching line pricing a response."""
    if len(prices) > MAX_PRICES:
        raise InvalidInput("prices", f"must be a list of at most {MAX_PRICES} lines")
    lines = [_price_line(index, line) for index, line in enumerate(prices)]
    async with ctx.change(actor=actor, action="integration.prices", project_id=project_id, provider=provider) as repo:
        integration = await require_integration(repo, project_id, provider)
        integration.prices = lines
        integration.updated_at = ctx.clock()
    return integration
