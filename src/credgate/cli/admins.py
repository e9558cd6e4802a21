"""`credgate admin`: admin tokens, panel users, their roles and sessions."""

import click

from credgate.cli.base import actor, main, pass_settings, read_secret, run
from credgate.config import Settings
from credgate.roles import ROLES, Role
from credgate.services import admins


@main.group()
def admin() -> None:
    """Admin tokens and panel users."""


_role_option = click.option(
    "--role",
    type=click.Choice(ROLES),
    default=Role.OWNER.value,
    show_default=True,
    help="owner: everything; project_admin: the --project ones; viewer: read-only (of the --project ones if given).",
)
_project_option = click.option(
    "--project", "project_ids", multiple=True, metavar="ID", help="A project granted (repeat for more)."
)


@admin.command("create-token")
@click.option("--name", default="admin", show_default=True, help="A label for the audit log.")
@_role_option
@_project_option
@pass_settings
def admin_create_token(settings: Settings, name: str, role: str, project_ids: tuple[str, ...]) -> None:
    """Print a new admin API token with its role (shown only now)."""
    click.echo(
        run(
            settings,
            lambda ctx: admins.create_admin_token(ctx, name=name, actor=actor(), role=role, project_ids=project_ids),
        )
    )


@admin.command("create-user")
@click.argument("username")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.option(
    "--single-sign-on", is_flag=True, help="No password: the user signs in through the identity provider as USERNAME."
)
@_role_option
@_project_option
@pass_settings
def admin_create_user(
    settings: Settings,
    username: str,
    password_stdin: bool,
    single_sign_on: bool,
    role: str,
    project_ids: tuple[str, ...],
) -> None:
    """Create a panel login with its role: a password, or single sign-on by the user's verified email address."""
    if password_stdin == single_sign_on:
        raise click.UsageError("give one of --password-stdin and --single-sign-on")
    password = read_secret("password") if password_stdin else None
    run(
        settings,
        lambda ctx: admins.create_admin_user(
            ctx, username=username, password=password, actor=actor(), role=role, project_ids=project_ids
        ),
    )
    click.echo(f"user {username} created")


@admin.command("set-role")
@click.argument("username")
@click.option("--role", type=click.Choice(ROLES), required=True, help="owner, project_admin or viewer.")
@_project_option
@pass_settings
def admin_set_role(settings: Settings, username: str, role: str, project_ids: tuple[str, ...]) -> None:
    """Give a panel user another role (and its projects); it applies from the user's next page."""
    run(
        settings,
        lambda ctx: admins.set_admin_role(ctx, username=username, role=role, project_ids=project_ids, actor=actor()),
    )
    click.echo(f"user {username} is now {role}")


@admin.command("end-sessions")
@click.argument("username")
@pass_settings
def admin_end_sessions(settings: Settings, username: str) -> None:
    """End every panel session of a user at once; it signs in again at its next page."""
    ended = run(settings, lambda ctx: admins.end_admin_sessions(ctx, username=username, actor=actor()))
    click.echo(f"ended {ended} session{'' if ended == 1 else 's'} of user {username}")
