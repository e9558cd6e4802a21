"""Every template through the gateway: the upstream receives the credential exactly where the provider
documents it, the required headers and query, and never the project token."""

from pathlib import Path

import httpx
import pytest

from credgate.catalog import Template, builtin_templates, load_templates
from credgate.config import Settings
from credgate.errors import InvalidInput, StartupError
from credgate.services import integrations, projects
from credgate.services.bootstrap import open_context
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.secret_sweep import SWEEP
from tests.upstream import Upstream

KEY = "prov-test-catalog-key-000000wxyz"
SWEEP.register(KEY)
BEARER = ("authorization", f"Bearer {KEY}")
# What each provider documents: (where the key goes, extra headers, extra query), written out here, apart
# from the catalogue, so the test checks the catalogue's data rather than echoing it.
DOCUMENTED: dict[str, tuple[tuple[str, str], dict[str, str], dict[str, str]]] = {
    "openai": (BEARER, {}, {}),
    "anthropic": (("x-api-key", KEY), {"anthropic-version": "2023-06-01"}, {}),
    "gemini": (("x-goog-api-key", KEY), {}, {}),
    "azure-openai": (("api-key", KEY), {}, {"api-version": "2024-10-21"}),
    "mistral": (BEARER, {}, {}),
    "groq": (BEARER, {}, {}),
    "together": (BEARER, {}, {}),
    "openrouter": (BEARER, {}, {}),
    "cohere": (BEARER, {}, {}),
    "deepseek": (BEARER, {}, {}),
    "xai": (BEARER, {}, {}),
    "perplexity": (BEARER, {}, {}),
    "elevenlabs": (("xi-api-key", KEY), {}, {}),
    "deepgram": (("authorization", f"Token {KEY}"), {}, {}),
    "stability": (BEARER, {}, {}),
    "replicate": (BEARER, {}, {}),
    "huggingface": (BEARER, {}, {}),
    "fireworks": (BEARER, {}, {}),
    "cerebras": (BEARER, {}, {}),
    "ollama": (BEARER, {}, {}),
    "vllm": (BEARER, {}, {}),
}
# The header each provider's SDK carries its key in: the project token rides there.
SDK_HEADER = {
    "anthropic": ("x-api-key", "{token}"),
    "gemini": ("x-goog-api-key", "{token}"),
    "azure-openai": ("api-key", "{token}"),
    "elevenlabs": ("xi-api-key", "{token}"),
    "deepgram": ("Authorization", "Token {token}"),
}
# Providers whose credential on the wire is derived from the stored key (a signature, an access token): each
# has its own test against a stand-in that verifies it with the provider's library.
DERIVED = {"bedrock": "tests/sdk/test_bedrock.py", "vertex": "tests/sdk/test_vertex.py"}
TEMPLATES = builtin_templates()
PLACED = [template for template in TEMPLATES.values() if template.provider not in DERIVED]


def test_the_catalogue_covers_the_providers_the_issue_names() -> None:
    assert {template.provider for template in TEMPLATES.values()} == set(DOCUMENTED) | set(DERIVED)
    assert all((Path(__file__).parents[2] / test).is_file() for test in DERIVED.values())


def concrete(path: str) -> str:
    return "/".join("model-x" if part == "*" else "a/b" if part == "**" else part for part in path.split("/"))


@pytest.fixture
async def bare_project(ctx: Context) -> Project:
    project, token = await projects.create_project(ctx, name="catalog", actor="t")
    return Project(id=project.id, token=token, key=KEY)


@pytest.mark.parametrize("template", PLACED, ids=lambda template: template.id)
async def test_every_template_places_the_key_as_documented(
    gateway_url: str, ctx: Context, bare_project: Project, upstream: Upstream, template: Template
) -> None:
    project = bare_project
    await integrations.add_template_integration(
        ctx,
        project_id=project.id,
        provider=template.provider,
        template_id=template.id,
        api_key=KEY,
        base_url=f"{upstream.url}/echo/{template.provider}",
        actor="t",
    )
    endpoint = template.endpoints[0]
    path = concrete(endpoint.path)
    name, value = SDK_HEADER.get(template.provider, ("Authorization", "Bearer {token}"))
    async with httpx.AsyncClient() as client:
        response = await client.request(
            "POST" if endpoint.method == "*" else endpoint.method,
            f"{gateway_url}/proxy/{template.provider}/{path}",
            headers={name: value.format(token=project.token)},
            json={"model": "m"} if endpoint.method in ("POST", "PUT", "PATCH") else None,
        )
    assert response.status_code == 200, response.text
    received = upstream.last
    placed, headers, query = DOCUMENTED[template.provider]
    assert received.path_qs.split("?")[0] == f"/echo/{template.provider}/{path}"
    assert received.header(placed[0]) == placed[1]
    assert all(received.header(header) == expected for header, expected in headers.items())
    assert all(f"{parameter}={expected}" in received.path_qs for parameter, expected in query.items())
    assert project.token not in str(received.headers) + received.path_qs


async def test_a_template_with_an_address_per_account_needs_the_base_url(ctx: Context, project: Project) -> None:
    with pytest.raises(InvalidInput, match="base_url: required for azure-openai-chat-completions"):
        await integrations.add_template_integration(
            ctx,
            project_id=project.id,
            provider="azure-openai",
            template_id="azure-openai-chat-completions",
            api_key=KEY,
            actor="t",
        )


USERS_TEMPLATE = """
provider = "internal-llm"
base_url = "https://llm.internal.example/v1"
auth = { method = "header", name = "x-internal-key" }

[[templates]]
id = "internal-llm-chat"
name = "Chat"
endpoints = [{ method = "POST", path = "chat" }]
"""


async def test_users_templates_in_the_data_dir_are_listed_beside_the_built_in_ones(
    settings: Settings, database: tuple[str, dict[str, object]]
) -> None:
    folder = settings.data_dir / "templates"
    folder.mkdir(parents=True)
    (folder / "internal.toml").write_text(USERS_TEMPLATE)
    ctx = await open_context(settings, connect_args=database[1])
    await ctx.database.dispose()
    assert ctx.templates["internal-llm-chat"].auth.model_dump() == {
        "method": "header",
        "name": "x-internal-key",
        "prefix": "",
    }
    assert "openai-chat-completions" in ctx.templates


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (USERS_TEMPLATE.replace('"internal-llm"', '"Internal LLM"'), "provider: Value error, must be lowercase"),
        (USERS_TEMPLATE.replace('id = "internal-llm-chat"', 'id = "openai-chat-completions"'), "defined twice"),
        (USERS_TEMPLATE.replace("[[templates]]", "[[templates"), "not valid TOML"),
    ],
)
async def test_an_invalid_users_template_stops_the_start_with_the_file_and_field(
    settings: Settings, database: tuple[str, dict[str, object]], text: str, problem: str
) -> None:
    folder = settings.data_dir / "templates"
    folder.mkdir(parents=True)
    (folder / "broken.toml").write_text(text)
    with pytest.raises(StartupError, match=r"broken\.toml") as raised:
        await open_context(settings, connect_args=database[1])
    assert problem in str(raised.value)


def test_the_documented_example_template_is_valid(tmp_path: Path) -> None:
    example = Path(__file__).parents[2] / "docs" / "templates" / "example.toml"
    assert load_templates(example.parent)
