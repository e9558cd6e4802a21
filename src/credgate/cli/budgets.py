"""`credgate budgets`: a project's spending limits."""

import click

from credgate.admin_api.schemas import BudgetOut
from credgate.cli.base import actor, main, pass_settings, print_json, run
from credgate.config import Settings
from credgate.services import budgets
from credgate.services.context import Context
from credgate.spending import METRICS, PERIODS


@main.group("budgets")
def budgets_group() -> None:
    """A project's budgets: requests, tokens or cost per UTC day or month; 402 once spent."""


async def _budget_states(ctx: Context, project_id: str, budget_id: str | None = None) -> list[BudgetOut]:
    states = await budgets.list_budgets(ctx, project_id=project_id)
    return [BudgetOut.of(state) for state in states if budget_id in (None, state.budget.id)]


@budgets_group.command("list")
@click.argument("project_id")
@pass_settings
def budgets_list(settings: Settings, project_id: str) -> None:
    """The project's budgets and what each has spent in its current period."""
    print_json(run(settings, lambda ctx: _budget_states(ctx, project_id)))


@budgets_group.command("add")
@click.argument("project_id")
@click.option("--metric", type=click.Choice(METRICS), required=True, help="What the budget counts.")
@click.option("--limit", type=float, required=True, help="Requests or tokens (whole), or dollars for cost.")
@click.option("--period", type=click.Choice(PERIODS), required=True, help="A UTC calendar day or month.")
@click.option("--provider", help="Only this provider's traffic (default: every provider).")
@click.option("--reserve", type=float, help="Tokens or cost budgets: held per request until its usage is known.")
@click.option("--per-subject", is_flag=True, help="The limit holds for each end user (token subject) apart.")
@pass_settings
def budgets_add(
    settings: Settings,
    project_id: str,
    metric: str,
    limit: float,
    period: str,
    provider: str | None,
    reserve: float | None,
    per_subject: bool,
) -> None:
    """Add a budget; requests over it get 402 until the period resets."""

    async def work(ctx: Context) -> list[BudgetOut]:
        budget = await budgets.add_budget(
            ctx,
            project_id=project_id,
            metric=metric,
            limit=limit,
            period=period,
            provider=provider,
            reserve=reserve,
            per_subject=per_subject,
            actor=actor(),
        )
        return await _budget_states(ctx, project_id, budget.id)

    print_json(run(settings, work)[0])


@budgets_group.command("update")
@click.argument("project_id")
@click.argument("budget_id")
@click.option("--limit", type=float, help="A new limit; the period's spend so far counts against it.")
@click.option("--period", type=click.Choice(PERIODS), help="A new period.")
@pass_settings
def budgets_update(
    settings: Settings, project_id: str, budget_id: str, limit: float | None, period: str | None
) -> None:
    """Change a budget's limit or period."""

    async def work(ctx: Context) -> list[BudgetOut]:
        await budgets.update_budget(
            ctx, project_id=project_id, budget_id=budget_id, limit=limit, period=period, actor=actor()
        )
        return await _budget_states(ctx, project_id, budget_id)

    print_json(run(settings, work)[0])


@budgets_group.command("remove")
@click.argument("project_id")
@click.argument("budget_id")
@pass_settings
def budgets_remove(settings: Settings, project_id: str, budget_id: str) -> None:
    """Remove a budget: its requests are no longer counted against it."""
    run(settings, lambda ctx: budgets.remove_budget(ctx, project_id=project_id, budget_id=budget_id, actor=actor()))
    click.echo(f"budget {budget_id} of project {project_id} removed")
