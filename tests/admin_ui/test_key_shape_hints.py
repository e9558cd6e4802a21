"""The panel says what shape a key must have where a provider's key is more than one string (AWS, Google
service accounts), and refuses a key of the wrong shape next to its field, before anything is stored."""

import httpx

from credgate.services import admins, integrations, projects
from credgate.services.context import Context
from tests.admin_ui.test_security import PASSWORD, csrf_of, signed_in_csrf
from tests.secret_sweep import SWEEP

MISSHAPEN = "AKIAWRONGSHAPEnosecret-key-0000abcd"


async def test_the_bedrock_key_field_names_its_shape_and_refuses_another(
    client: httpx.AsyncClient, ctx: Context
) -> None:
    SWEEP.register(MISSHAPEN)
    await admins.create_admin_user(ctx, username="admin", password=PASSWORD, actor="tests")
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    await signed_in_csrf(client)
    page = await client.get(f"/admin/projects/{project.id}/add?provider=bedrock")
    assert "ACCESS_KEY_ID:SECRET_ACCESS_KEY" in page.text
    assert 'aria-describedby="api_key_shape"' in page.text
    response = await client.post(
        f"/admin/projects/{project.id}/add",
        data={
            "csrf": csrf_of(page.text),
            "provider": "bedrock",
            "name": "bedrock",
            "template": "bedrock-converse",
            "api_key": MISSHAPEN,
        },
    )
    assert response.status_code == 422
    assert "The key must be ACCESS_KEY_ID:SECRET_ACCESS_KEY" in response.text
    assert await integrations.list_integrations(ctx, project_id=project.id) == []


async def test_a_plain_key_provider_shows_no_shape(client: httpx.AsyncClient, ctx: Context) -> None:
    await admins.create_admin_user(ctx, username="admin", password=PASSWORD, actor="tests")
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    await signed_in_csrf(client)
    page = await client.get(f"/admin/projects/{project.id}/add?provider=openai")
    assert 'name="api_key"' in page.text
    assert "api_key_shape" not in page.text
