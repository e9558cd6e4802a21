"""`credgate webhooks`: where a project's events are delivered."""

import click

from credgate.admin_api.schemas import DeliveryOut, WebhookOut, WebhookSecretOut
from credgate.cli.base import actor, limited, main, pass_settings, print_json, run
from credgate.config import Settings
from credgate.limits import ListLimit
from credgate.services import events


@main.group("webhooks")
def webhooks_group() -> None:
    """A project's webhooks: where its events are posted, signed, and the delivery log."""


@webhooks_group.command("list")
@click.argument("project_id")
@pass_settings
def webhooks_list(settings: Settings, project_id: str) -> None:
    """The project's webhooks (never their secrets)."""
    print_json(
        [WebhookOut.of(each) for each in run(settings, lambda ctx: events.list_webhooks(ctx, project_id=project_id))]
    )


@webhooks_group.command("add")
@click.argument("project_id")
@click.argument("url")
@click.option(
    "--event",
    "types",
    multiple=True,
    help=f"An event type it takes (repeatable; none: every type): {', '.join(events.EVENT_TYPES)}.",
)
@pass_settings
def webhooks_add(settings: Settings, project_id: str, url: str, types: tuple[str, ...]) -> None:
    """Add a webhook; prints its signing secret, which is never shown again."""
    webhook, secret = run(
        settings, lambda ctx: events.add_webhook(ctx, project_id=project_id, url=url, events=types, actor=actor())
    )
    print_json(WebhookSecretOut(webhook=WebhookOut.of(webhook), secret=secret))


@webhooks_group.command("update")
@click.argument("project_id")
@click.argument("webhook_id")
@click.option("--url", help="A new URL.")
@click.option("--event", "types", multiple=True, help="The event types it takes (replaces them).")
@click.option("--all-events", is_flag=True, help="Take every event type.")
@click.option("--enable/--disable", "enabled", default=None, help="Post events to it, or stop.")
@pass_settings
def webhooks_update(
    settings: Settings,
    project_id: str,
    webhook_id: str,
    url: str | None,
    types: tuple[str, ...],
    all_events: bool,
    enabled: bool | None,
) -> None:
    """Change a webhook's URL, event types, or whether it is enabled."""
    chosen = [] if all_events else (list(types) if types else None)
    found = run(
        settings,
        lambda ctx: events.update_webhook(
            ctx, project_id=project_id, webhook_id=webhook_id, url=url, events=chosen, enabled=enabled, actor=actor()
        ),
    )
    print_json(WebhookOut.of(found))


@webhooks_group.command("test")
@click.argument("project_id")
@click.argument("webhook_id")
@pass_settings
def webhooks_test(settings: Settings, project_id: str, webhook_id: str) -> None:
    """Queue a webhook.test event for this webhook; a running gateway posts it within seconds."""
    event = run(
        settings, lambda ctx: events.send_test_event(ctx, project_id=project_id, webhook_id=webhook_id, actor=actor())
    )
    print_json({"id": event.id, "type": event.type})


@webhooks_group.command("deliveries")
@click.argument("project_id")
@click.option("--webhook", "webhook_id", help="Only this webhook's.")
@click.option("--limit", default=50, show_default=True, **limited(ListLimit, "How many, newest first"))
@pass_settings
def webhooks_deliveries(settings: Settings, project_id: str, webhook_id: str | None, limit: int) -> None:
    """The delivery log: each event to each webhook, its state, attempts and the receiver's last answer."""
    found = run(
        settings,
        lambda ctx: events.list_deliveries(ctx, project_id=project_id, webhook_id=webhook_id, limit=limit),
    )
    print_json([DeliveryOut.of(delivery) for delivery in found])


@webhooks_group.command("remove")
@click.argument("project_id")
@click.argument("webhook_id")
@pass_settings
def webhooks_remove(settings: Settings, project_id: str, webhook_id: str) -> None:
    """Remove a webhook, its secret and its deliveries."""
    run(settings, lambda ctx: events.remove_webhook(ctx, project_id=project_id, webhook_id=webhook_id, actor=actor()))
    click.echo(f"webhook {webhook_id} of project {project_id} removed")
