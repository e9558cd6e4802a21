"""Projects and their tokens: issue, rotate with grace and expiry, revoke, delete; only hashes are stored."""

import asyncio
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select

from credgate.crypto import hash_token
from credgate.errors import NotFound
from credgate.services import integrations, projects
from credgate.services.access import resolve_access
from credgate.services.context import Context
from credgate.services.projects import ProjectChanges
from credgate.specs import IdentityProviderSpec
from credgate.storage.models import Base, Integration, ProjectToken, ProviderKey
from tests.secret_sweep import SWEEP
from tests.services.helpers import every_row

KEY = "sk-test-projectsprojects1234"


async def new_project(ctx: Context, *, name: str = "demo") -> tuple[str, str]:
    """A project with an OpenAI integration; returns its id and token."""
    project, token = await projects.create_project(ctx, name=name, actor="tests")
    SWEEP.register(KEY)
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="openai", template_id="openai-chat-completions", api_key=KEY, actor="t"
    )
    return project.id, token


async def rotate(ctx: Context, project_id: str, *, grace: int = 0, expires_in: int | None = None) -> str:
    _, token = await projects.rotate_project_token(
        ctx, project_id=project_id, actor="tests", grace_seconds=grace, expires_in_seconds=expires_in
    )
    return token


async def works(ctx: Context, token: str) -> bool:
    return await resolve_access(ctx, token=token, provider="openai") is not None


def freeze(ctx: Context, at: datetime) -> None:
    ctx.clock = lambda: at


async def row_count(ctx: Context, model: type[Base]) -> int:
    async with ctx.database.engine.connect() as connection:
        return (await connection.execute(select(func.count()).select_from(model))).scalar_one()


async def test_a_new_project_gets_a_working_token(ctx: Context) -> None:
    project_id, token = await new_project(ctx)
    access = await resolve_access(ctx, token=token, provider="openai")
    assert token.startswith("cgp_")
    assert access is not None
    assert access.project_id == project_id


async def test_only_the_sha256_of_a_token_is_stored(ctx: Context) -> None:
    project_id, token = await new_project(ctx)
    rotated = await rotate(ctx, project_id, grace=60)
    async with ctx.database.engine.connect() as connection:
        rows = await every_row(connection)
        hashes = set((await connection.execute(select(ProjectToken.token_hash))).scalars())
    assert hashes == {hash_token(token), hash_token(rotated)}
    assert not [row for row in rows if token[4:] in row or rotated[4:] in row]


async def test_rotating_without_grace_stops_the_old_token_at_once(ctx: Context) -> None:
    project_id, old = await new_project(ctx)
    assert await works(ctx, old)  # cached now: the rotation must clear it
    new = await rotate(ctx, project_id)
    assert not await works(ctx, old)
    assert await works(ctx, new)


async def test_rotating_with_grace_keeps_the_old_token_until_the_grace_ends(ctx: Context) -> None:
    project_id, old = await new_project(ctx)
    start = ctx.clock()
    freeze(ctx, start)
    new = await rotate(ctx, project_id, grace=60)
    freeze(ctx, start + timedelta(seconds=59))
    assert await works(ctx, old)
    assert await works(ctx, new)
    freeze(ctx, start + timedelta(seconds=61))  # no change in between: the cached answer must expire too
    assert not await works(ctx, old)
    assert await works(ctx, new)


async def test_a_token_with_an_expiry_stops_working_when_it_expires(ctx: Context) -> None:
    project_id, _ = await new_project(ctx)
    start = ctx.clock()
    freeze(ctx, start)
    token = await rotate(ctx, project_id, expires_in=30)
    freeze(ctx, start + timedelta(seconds=29))
    assert await works(ctx, token)
    freeze(ctx, start + timedelta(seconds=31))
    assert not await works(ctx, token)


async def test_a_grace_period_never_extends_an_earlier_expiry(ctx: Context) -> None:
    project_id, _ = await new_project(ctx)
    start = ctx.clock()
    freeze(ctx, start)
    short_lived = await rotate(ctx, project_id, expires_in=10)
    await rotate(ctx, project_id, grace=3600)
    freeze(ctx, start + timedelta(seconds=11))
    assert not await works(ctx, short_lived)


async def test_a_token_without_expiry_keeps_working(ctx: Context) -> None:
    _, token = await new_project(ctx)
    freeze(ctx, ctx.clock() + timedelta(days=3650))
    assert await works(ctx, token)


async def test_revoking_stops_every_token_until_the_next_rotation(ctx: Context) -> None:
    project_id, old = await new_project(ctx)
    in_grace = await rotate(ctx, project_id, grace=3600)
    assert await works(ctx, old)
    await projects.revoke_project_tokens(ctx, project_id=project_id, actor="tests")
    assert not await works(ctx, old)
    assert not await works(ctx, in_grace)
    assert await works(ctx, await rotate(ctx, project_id))


async def test_deleting_a_project_destroys_its_tokens_integrations_and_keys(ctx: Context) -> None:
    doomed, doomed_token = await new_project(ctx, name="doomed")
    _, kept_token = await new_project(ctx, name="kept")
    assert await works(ctx, doomed_token)
    await projects.delete_project(ctx, project_id=doomed, actor="tests")
    assert not await works(ctx, doomed_token)
    assert await works(ctx, kept_token)
    assert [await row_count(ctx, model) for model in (ProjectToken, Integration, ProviderKey)] == [1, 1, 1]
    with pytest.raises(NotFound):
        await projects.get_project(ctx, project_id=doomed)


async def test_renaming_keeps_the_token(ctx: Context) -> None:
    project_id, token = await new_project(ctx)
    await projects.update_project(ctx, project_id=project_id, changes=ProjectChanges(name="renamed"), actor="tests")
    assert (await projects.get_project(ctx, project_id=project_id)).name == "renamed"
    assert await works(ctx, token)


async def test_two_projects_claiming_one_identity_provider_at_the_same_moment_get_one_claim(ctx: Context) -> None:
    """An identity token finds its project by issuer and audience alone: two claims made at once must queue, the
    second seeing the first's (PostgreSQL reads each statement's snapshot; SQLite serialises the writes)."""
    trusted = IdentityProviderSpec(
        jwks_url="https://auth.example/.well-known/jwks.json", issuer="https://auth.example/", audience="app"
    )
    claimants = [(await projects.create_project(ctx, name=f"p{index}", actor="t"))[0] for index in range(4)]
    claims = await asyncio.gather(
        *(
            projects.update_project(
                ctx, project_id=project.id, changes=ProjectChanges(identity_provider=trusted), actor="t"
            )
            for project in claimants
        ),
        return_exceptions=True,
    )
    assert sorted(type(claim).__name__ for claim in claims) == ["Conflict", "Conflict", "Conflict", "Project"]
    async with ctx.database.transaction(write=False) as repo:
        holders = [project for project, _, trusting in await repo.project_directory() if trusting]
    assert len(holders) == 1
