"""Panel passwords are hashed at argon2id's production cost (the panel and reliability tests use a quick cost)."""

from argon2 import extract_parameters, profiles

from credgate.services import admins, panel_sessions
from credgate.services.context import Context


async def test_a_panel_password_is_stored_as_argon2id_at_the_production_cost(ctx: Context) -> None:
    user = await admins.create_admin_user(ctx, username="admin", password="correct horse battery", actor="t")
    assert user.password_hash.startswith("$argon2id$")
    assert extract_parameters(user.password_hash) == profiles.RFC_9106_LOW_MEMORY  # argon2-cffi's default: 64 MiB, t=3
    assert "correct horse battery" not in user.password_hash
    _, signed_in = await panel_sessions.sign_in(ctx, username="admin", password="correct horse battery")
    assert signed_in.username == "admin"
