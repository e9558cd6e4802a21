"""The admin API against its own OpenAPI document, fuzzed by Schemathesis: every operation, with valid and invalid
input, answers without a server error and as its document says (the error envelope included).

In process: Schemathesis generates the cases and checks the responses; they are sent through the `client`
fixture's ASGI transport on the test's own event loop, so the app uses the test's database on every backend.
A valid path names a real project and its integration, so the operations reach the services and the database
rather than stopping at 404. Fuzzed on one database: PostgreSQL where one is configured (the stricter of the two:
it refuses a NUL character in text, say), else SQLite; the routes' own tests run on both.
"""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.schemas import BaseSchema
from schemathesis.specs.openapi.checks import response_schema_conformance

from credgate.app import create_app
from credgate.config import Settings
from credgate.services import integrations, projects
from credgate.services.context import Context
from credgate.services.verification import Verification
from tests.conftest import POSTGRES_URL
from tests.secret_sweep import SWEEP

KEY = "sk-test-schemathesis-0000000000wxyz"


@dataclass(frozen=True, slots=True)
class AdminApi:
    """The in-process admin API, the loop it runs on, and a project with an `openai` integration."""

    client: httpx.AsyncClient
    loop: asyncio.AbstractEventLoop
    project_id: str

    def send(self, case: schemathesis.Case[Any]) -> httpx.Response:
        generated = case.as_transport_kwargs(base_url=str(self.client.base_url))
        headers = httpx.Headers(generated.get("headers", {}))
        headers["Authorization"] = self.client.headers["Authorization"]
        if generated.get("cookies"):
            headers["Cookie"] = "; ".join(f"{name}={value}" for name, value in generated["cookies"].items())
        body: dict[str, Any] = {}
        if "json" in generated:
            body["json"] = generated["json"]
        elif isinstance(generated.get("data"), bytes | str):  # a raw body, for media types other than JSON
            body["content"] = generated["data"]
        elif generated.get("data") is not None:
            body["data"] = generated["data"]
        request = self.client.build_request(
            generated["method"], generated["url"], params=generated.get("params"), headers=headers, **body
        )
        return self.loop.run_until_complete(self.client.send(request))


async def _no_verification(**_call: Any) -> Verification:
    return Verification(accepted=None, status=None, message="not verified in this test")


def _schema() -> BaseSchema:
    # The document does not depend on the settings, so none are read (nor is any file touched) to build it.
    document = create_app(Settings.model_construct()).control.openapi()
    # The mint is the proxy's, with a project token, and this harness starts no proxy: test_client_tokens.py
    # checks its answers against the document.
    loaded = schemathesis.openapi.from_dict(document).exclude(path="/api/v1/client-tokens")
    # Signed in as an admin: the 401s are another test's, the fuzzing is of what an admin may send.
    loaded.config.generation.update(
        modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], with_security_parameters=False
    )
    return loaded


@pytest.fixture
def backend() -> str:
    return "postgresql" if POSTGRES_URL else "sqlite"


@pytest.fixture
async def admin_api(settings: Settings, ctx: Context, admin_token: str) -> AsyncIterator[AdminApi]:
    SWEEP.register(KEY)
    project, _ = await projects.create_project(ctx, name="fuzzed", actor="tests")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="openai", template_id="openai-chat-completions", api_key=KEY, actor="t"
    )
    app = create_app(settings, context=ctx)
    app.runtime.verify_key = _no_verification  # type: ignore[method-assign]  # no provider is called from here
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    headers = {"Authorization": f"Bearer {admin_token}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://credgate.test", headers=headers) as client:
        yield AdminApi(client=client, loop=asyncio.get_running_loop(), project_id=project.id)


schema = _schema()


@schema.parametrize()
@hypothesis.settings(
    max_examples=10,  # per operation, besides Schemathesis's boundary cases: the module stays fast
    deadline=None,
    derandomize=True,  # the same cases on every run: CI must not turn red by chance
    database=None,
    # Deliberate: an operation's examples share its database (a delete then finds nothing to delete, say).
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
def test_every_operation_answers_without_server_error_and_as_documented(
    case: schemathesis.Case[Any], admin_api: AdminApi
) -> None:
    path = case.meta.components.get(ParameterLocation.PATH) if case.meta is not None else None
    if case.path_parameters and (path is None or path.mode is not GenerationMode.NEGATIVE):
        # A valid path names the real project and its integration; an invalid one is kept, to be refused.
        case.path_parameters["project_id"] = admin_api.project_id
        if "provider" in case.path_parameters:
            case.path_parameters["provider"] = "openai"
    response = admin_api.send(case)
    SWEEP.capture(f"schemathesis {case.method} {case.path}", response.text)
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
