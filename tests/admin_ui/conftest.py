"""Panel tests in process. They are about pages, forms and session defences, not password hashing: argon2 at a
quick cost here (as in tests/reliability); tests/services/test_password_hashing.py holds the production cost, and
the browser tests sign in against `credgate serve` at that cost."""

import pytest

from credgate.services import admins, integrations, projects
from credgate.services.context import Context
from tests.admin_ui.test_security import PASSWORD
from tests.reliability.test_auth_isolation import (  # noqa: F401  (an autouse fixture, re-exported for this folder)
    _quick_password_hashing,
)
from tests.secret_sweep import SWEEP

KEY = "sk-test-panel-pages-key-0000qrst"


@pytest.fixture
async def project_id(ctx: Context) -> str:
    """An admin, and a project with OpenAI's chat template set up with KEY."""
    SWEEP.register(KEY)
    await admins.create_admin_user(ctx, username="admin", password=PASSWORD, actor="tests")
    project, _ = await projects.create_project(ctx, name="p", actor="t")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="openai", template_id="openai-chat-completions", api_key=KEY, actor="t"
    )
    return project.id
