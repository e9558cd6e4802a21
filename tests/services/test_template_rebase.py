"""A template's endpoints land under the integration's own base URL, naming the same upstream paths, whether the
integration was set up with another base URL or before the template's base URL moved."""

from credgate.services import integrations, projects
from credgate.services.context import Context
from credgate.services.verification import Verification, verify_provider_key
from credgate.specs import Endpoint
from tests.secret_sweep import SWEEP

KEY = "sk-mistral-rebase-0123456789"


async def mistral_with_base(ctx: Context, base_url: str) -> str:
    SWEEP.register(KEY)
    project, _ = await projects.create_project(ctx, name="rebase", actor="t")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="mistral", template_id="mistral-chat-completions", api_key=KEY,
        base_url=base_url, actor="t",
    )  # fmt: skip
    return project.id


async def test_endpoints_follow_the_integrations_own_base_path(ctx: Context) -> None:
    project_id = await mistral_with_base(ctx, "https://api.mistral.ai/v1")  # the template's base is the host root
    integration, created = await integrations.add_template_integration(
        ctx, project_id=project_id, provider="mistral", template_id="mistral-embeddings", actor="t"
    )
    assert not created
    assert {entry["path"] for entry in integration.endpoints} == {"chat/completions", "embeddings"}


async def test_a_base_url_on_another_host_keeps_the_templates_paths(ctx: Context) -> None:
    project_id = await mistral_with_base(ctx, "https://llm-proxy.example.com/mistral")
    integration = await integrations.get_integration(ctx, project_id=project_id, provider="mistral")
    assert [entry["path"] for entry in integration.endpoints] == ["v1/chat/completions"]


async def test_the_verification_call_follows_the_base_path_too(ctx: Context) -> None:
    project_id = await mistral_with_base(ctx, "https://api.mistral.ai/v1")
    calls: list[Endpoint] = []

    async def verifier(*, project_id: str, integration: object, call: Endpoint) -> Verification:
        calls.append(call)
        return Verification(accepted=True, status=200, message="ok")

    await verify_provider_key(ctx, verifier, project_id=project_id, provider="mistral")
    assert calls == [Endpoint(method="GET", path="models")]
