"""A project's budgets (what each has spent this period, added, changed, removed) and an integration's price list
(one line per model pattern, edited as text)."""

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from credgate.admin_ui.base import Visit, field, field_error, form_of, redirect, render, visit
from credgate.errors import Conflict, InvalidInput, NotFound
from credgate.services import budgets, integrations, projects
from credgate.spending import MICROS_PER_DOLLAR

METRICS = {"requests": "Requests", "tokens": "Tokens", "cost": "Cost (dollars)"}
PERIODS = {"day": "Day (UTC)", "month": "Month (UTC)"}


def _limit(text: str, *, field_name: str = "limit") -> float:
    """Typed text as a number: "$1,250.50", "12_000" (the service judges it for the budget's metric)."""
    cleaned = text.strip().removeprefix("$").replace(",", "").replace("_", "")
    try:
        number = float(cleaned)
    except ValueError:
        raise InvalidInput(field_name, "must be a number") from None
    return number


def _percentages(text: str) -> list[object]:
    """ "80, 100" or "80% 100%" as the thresholds; what is not a whole number is left for the service to refuse."""
    parts = text.replace(",", " ").replace("%", " ").split()
    return [int(part) if part.isdigit() else part for part in parts]


def amount_text(metric: str, amount: int) -> str:
    """A stored amount as the page shows it: "$1.25", "12,000"."""
    return f"${amount / MICROS_PER_DOLLAR:,.2f}" if metric == "cost" else f"{amount:,}"


async def _budgets_page(
    request: Request, current: Visit, extra: dict[str, object] | None = None, status: int = 200
) -> Response:
    project_id = request.path_params["project_id"]
    project = await projects.get_project(current.ctx, project_id=project_id)
    found = await integrations.list_integrations(current.ctx, project_id=project_id)
    states = await budgets.list_budgets(current.ctx, project_id=project_id)
    context = {
        "project": project,
        "providers": [integration.provider for integration in found],
        "states": [
            (
                state,
                amount_text(state.budget.metric, state.spent),
                amount_text(state.budget.metric, state.budget.amount),
                min(100, round(100 * state.spent / state.budget.amount)),
            )
            for state in states
        ],
        "metrics": METRICS,
        "periods": PERIODS,
        "errors": {},
        "form": {
            "metric": "requests",
            "period": "month",
            "limit": "",
            "provider": "",
            "thresholds": "80, 100",
            "reserve": "",
            "per_subject": "",
        },
    }
    return await render(request, "budgets.html", context | (extra or {}), current=current, status=status)


def _back(request: Request) -> str:
    return f"/admin/projects/{request.path_params['project_id']}/budgets"


async def page(request: Request) -> Response:
    return await _budgets_page(request, await visit(request))


async def add(request: Request) -> Response:
    current = await visit(request)
    form = await form_of(request, current)
    typed = {name: field(form, name) for name in ("metric", "period", "limit", "provider", "thresholds", "reserve")}
    typed["per_subject"] = "on" if field(form, "per_subject") == "on" else ""
    try:
        await budgets.add_budget(
            current.ctx,
            project_id=request.path_params["project_id"],
            metric=typed["metric"],
            limit=_limit(typed["limit"]),
            period=typed["period"],
            provider=typed["provider"] or None,
            thresholds=_percentages(typed["thresholds"]),
            reserve=_limit(typed["reserve"], field_name="reserve") if typed["reserve"] else None,
            per_subject=bool(typed["per_subject"]),
            actor=current.actor,
        )
    except (InvalidInput, Conflict, NotFound) as error:
        errors = field_error(error) if isinstance(error, InvalidInput) else {"provider": error.message}
        return await _budgets_page(request, current, {"errors": errors, "form": typed}, status=422)
    whose = "each end user's requests over it get" if typed["per_subject"] else "requests over it get"
    await current.flash(f"Budget added: {whose} 402 until its period resets.")
    return redirect(_back(request))


async def change(request: Request) -> Response:
    current = await visit(request)
    form = await form_of(request, current)
    budget_id = request.path_params["budget_id"]
    try:
        await budgets.update_budget(
            current.ctx,
            project_id=request.path_params["project_id"],
            budget_id=budget_id,
            limit=_limit(field(form, "limit")),
            actor=current.actor,
        )
    except InvalidInput as error:
        errors = {f"limit-{budget_id}": field_error(error)["limit"]}
        return await _budgets_page(request, current, {"errors": errors}, status=422)
    await current.flash("Budget limit saved.")
    return redirect(_back(request))


async def remove_confirm(request: Request) -> Response:
    current = await visit(request, changing=True)
    context = {
        "title": "Remove this budget?",
        "consequence": "Requests are no longer counted against it; what was spent stays in the request log.",
        "action": request.url.path,
        "button": "Remove budget",
        "back": _back(request),
    }
    return await render(request, "confirm.html", context, current=current)


async def remove(request: Request) -> Response:
    current = await visit(request)
    await form_of(request, current)
    await budgets.remove_budget(
        current.ctx,
        project_id=request.path_params["project_id"],
        budget_id=request.path_params["budget_id"],
        actor=current.actor,
    )
    await current.flash("Budget removed.")
    return redirect(_back(request))


def prices_text(lines: list[dict[str, Any]]) -> str:
    return "\n".join(f"{line['model']} {line['input']:g} {line['output']:g}" for line in lines)


def _price_lines(text: str) -> list[dict[str, object]]:
    """`MODEL INPUT OUTPUT` lines (blank lines skipped), read as the API's price lines."""
    lines: list[dict[str, object]] = []
    for number, line in enumerate(filter(None, (raw.strip() for raw in text.splitlines())), 1):
        parts = line.replace(",", " ").split()
        if len(parts) != 3:
            raise InvalidInput("prices", f"line {number} must be a model (or pattern) and two prices")
        try:
            input_price, output_price = (float(part.lstrip("$")) for part in parts[1:])
        except ValueError:
            raise InvalidInput("prices", f"line {number}: the prices must be numbers of dollars") from None
        lines.append({"model": parts[0], "input": input_price, "output": output_price})
    return lines


async def prices_page(request: Request) -> Response:
    return await _prices_page(request, await visit(request))


async def _prices_page(
    request: Request, current: Visit, *, text: str | None = None, error: str = "", status: int = 200
) -> Response:
    project_id, provider = request.path_params["project_id"], request.path_params["provider"]
    project = await projects.get_project(current.ctx, project_id=project_id)
    integration = await integrations.get_integration(current.ctx, project_id=project_id, provider=provider)
    context = {
        "project": project,
        "integration": integration,
        "text": prices_text(integration.prices) if text is None else text,
        "error": error,
    }
    return await render(request, "prices.html", context, current=current, status=status)


async def prices(request: Request) -> Response:
    current = await visit(request)
    form = await form_of(request, current)
    text = field(form, "prices")
    try:
        await budgets.set_prices(
            current.ctx,
            project_id=request.path_params["project_id"],
            provider=request.path_params["provider"],
            prices=_price_lines(text),
            actor=current.actor,
        )
    except InvalidInput as error:
        # The service names the API's field ("prices[2].input"); the page names the line of the text.
        line = re.fullmatch(r"prices\[(\d+)\]\.(\w+)", error.field)
        message = f"Line {line[1]}, {line[2]}: {error.problem}." if line else field_error(error)[error.field]
        return await _prices_page(request, current, text=text, error=message, status=422)
    await current.flash(f"Prices of {request.path_params['provider']} saved.")
    return redirect(request.url.path)


_BUDGETS = "/projects/{project_id}/budgets"
_PRICES = "/projects/{project_id}/integrations/{provider}/prices"
routes = [
    Route(_BUDGETS, page, methods=["GET"]),
    Route(_BUDGETS, add, methods=["POST"]),
    Route(_BUDGETS + "/{budget_id}", change, methods=["POST"]),
    Route(_BUDGETS + "/{budget_id}/remove", remove_confirm, methods=["GET"]),
    Route(_BUDGETS + "/{budget_id}/remove", remove, methods=["POST"]),
    Route(_PRICES, prices_page, methods=["GET"]),
    Route(_PRICES, prices, methods=["POST"]),
]
