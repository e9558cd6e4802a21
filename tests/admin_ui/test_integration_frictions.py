"""What a new user met on the integration pages, each pinned: Add new API keeps what was entered (the key sealed in
the session, never in a page) across Back and a refusal; the SSRF guard is met before the review and in the form;
adding a template to an integration reviews what it really uses; the auth fields go by method and can be changed
later; messages name fields and count from 1; a bad endpoint row keeps every row and saves nothing."""

import html
import re
from pathlib import Path

import httpx

from credgate.admin_ui import messages
from credgate.admin_ui.auth_form import word_prefix
from credgate.services import integrations
from credgate.services.context import Context
from credgate.services.integrations import IntegrationChanges
from tests.admin_ui.test_pages import field_error
from tests.admin_ui.test_security import signed_in_csrf
from tests.secret_sweep import SWEEP

ANTHROPIC_KEY = "sk-ant-test-frictions-key-00001234"
MISSHAPEN = "AKIAFRICTIONSnosecret-key-0000abcd"
CUSTOM_KEY = "custom-frictions-key-0000wxyz"
for _key in (ANTHROPIC_KEY, MISSHAPEN, CUSTOM_KEY):
    SWEEP.register(_key)
KEPT = "A key was entered (ends <code>…1234</code>) and is kept"
CSS = Path(__file__).parents[2] / "src/credgate/admin_ui/static/panel.css"


async def enter(client: httpx.AsyncClient, project_id: str, csrf: str, **fields: str) -> httpx.Response:
    """Post Add new API's form: Anthropic's messages template under `anthropic` unless told otherwise."""
    data = {"csrf": csrf, "provider": "anthropic", "name": "anthropic", "template": "anthropic-messages"}
    return await client.post(f"/admin/projects/{project_id}/add", data=data | fields)


def shown(text: str) -> str:
    return html.unescape(text)


async def test_back_from_the_review_finds_the_form_as_entered_and_the_kept_key_is_saved(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    fields = {"name": "claude", "template": "anthropic-models", "base_url": "https://claude.example.com/"}
    assert (await enter(client, project_id, csrf, **fields, api_key=ANTHROPIC_KEY)).status_code == 303
    back = await client.get(f"/admin/projects/{project_id}/add?provider=anthropic")
    assert 'id="name" name="name" value="claude"' in back.text
    assert 'value="https://claude.example.com"' in back.text
    assert re.search(r'value="anthropic-models"\s+checked', back.text)
    assert KEPT in back.text
    assert ANTHROPIC_KEY not in back.text
    assert (await enter(client, project_id, csrf, **fields)).status_code == 303  # the key field left empty
    assert (await client.post(f"/admin/projects/{project_id}/add/review", data={"csrf": csrf})).status_code == 303
    saved = await integrations.get_integration(ctx, project_id=project_id, provider="claude")
    assert (saved.base_url, saved.key.hint if saved.key else None) == ("https://claude.example.com", "…1234")


async def test_a_refused_form_keeps_the_key_sealed_and_says_so(client: httpx.AsyncClient, project_id: str) -> None:
    csrf = await signed_in_csrf(client)
    refused = await enter(client, project_id, csrf, name="Claude!", api_key=ANTHROPIC_KEY)
    assert refused.status_code == 422
    assert (field_error(refused.text, "name") or "").startswith("The name must be lowercase letters")
    assert KEPT in refused.text
    assert ANTHROPIC_KEY not in refused.text
    assert (await enter(client, project_id, csrf, name="claude")).status_code == 303
    assert "…1234" in (await client.get(f"/admin/projects/{project_id}/add/review")).text


async def test_a_key_of_the_wrong_shape_is_not_kept_and_the_page_says_to_enter_it_again(
    client: httpx.AsyncClient, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    bedrock = {"provider": "bedrock", "name": "bedrock", "template": "bedrock-converse"}
    refused = await enter(client, project_id, csrf, **bedrock, api_key=MISSHAPEN)
    assert refused.status_code == 422
    assert "Enter it again: a refused key is not kept." in refused.text
    assert "A key was entered" not in refused.text
    again = await enter(client, project_id, csrf, **bedrock)
    assert "Enter the provider&#39;s API key" in again.text


async def test_custom_configure_refused_says_to_enter_the_key_again(client: httpx.AsyncClient, project_id: str) -> None:
    csrf = await signed_in_csrf(client)
    data = {"csrf": csrf, "provider": "Acme", "base_url": "https://api.example.com", "api_key": CUSTOM_KEY}
    refused = await client.post(f"/admin/projects/{project_id}/custom", data=data)
    assert refused.status_code == 422
    told = field_error(refused.text, "api_key")
    assert told == "Nothing was saved. Enter the key again: it is never sent back to the page."


async def test_a_private_base_url_is_refused_in_the_form_before_the_review_and_at_save(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    ctx.allow_private_upstreams = False
    refused = await enter(client, project_id, csrf, base_url="https://10.0.0.5", api_key=ANTHROPIC_KEY)
    assert refused.status_code == 422
    assert (field_error(refused.text, "base_url") or "").startswith("The base URL reaches a loopback, private")
    assert '<nav aria-label="Main">' in refused.text
    assert (await client.get(f"/admin/projects/{project_id}/add/review")).status_code == 422  # checked again there
    ctx.allow_private_upstreams = True  # reviewed under one setting, saved under another
    assert (await enter(client, project_id, csrf, base_url="https://10.0.0.5")).status_code == 303
    ctx.allow_private_upstreams = False
    saved = await client.post(f"/admin/projects/{project_id}/add/review", data={"csrf": csrf})
    assert saved.status_code == 422
    assert (field_error(saved.text, "base_url") or "").startswith("The base URL reaches a loopback, private")
    assert '<nav aria-label="Main">' in saved.text
    assert [found.provider for found in await integrations.list_integrations(ctx, project_id=project_id)] == ["openai"]


def settings_form(csrf: str, **fields: str) -> dict[str, str]:
    form = {"csrf": csrf, "enabled": "on", "base_url": "https://api.openai.com/v1", "timeout_seconds": "600"}
    timeouts = {"stream_idle_timeout_seconds": "300", "total_timeout_seconds": "3600"}
    return form | timeouts | {"headers": "", "query": "", "private_networks": ""} | fields


async def test_settings_refuse_a_private_base_url_in_the_page_keeping_what_was_typed(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    ctx.allow_private_upstreams = False
    data = settings_form(csrf, base_url="https://10.0.0.5/v1", timeout_seconds="45", headers="OpenAI-Project: p1\n")
    refused = await client.post(f"/admin/projects/{project_id}/integrations/openai", data=data)
    assert refused.status_code == 422
    assert (field_error(refused.text, "base_url") or "").startswith("Reaches a loopback, private")
    assert 'value="https://10.0.0.5/v1"' in refused.text
    assert 'value="45"' in refused.text
    assert "OpenAI-Project: p1" in refused.text
    assert '<nav aria-label="Main">' in refused.text
    stored = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert (stored.base_url, stored.headers) == ("https://api.openai.com/v1", {})


async def test_a_template_added_to_a_provider_reviews_its_own_base_url_what_is_new_and_its_key(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    moved = IntegrationChanges(base_url="https://llm-proxy.example.com/openai/v1")
    await integrations.update_integration(ctx, project_id=project_id, provider="openai", changes=moved, actor="t")
    form = await client.get(f"/admin/projects/{project_id}/add?provider=openai")
    assert re.search(r'value="openai-responses"\s+checked', form.text)  # not the chat template it has already
    openai = {"provider": "openai", "name": "openai"}
    assert (await enter(client, project_id, csrf, **openai, template="openai-responses")).status_code == 303
    review = (await client.get(f"/admin/projects/{project_id}/add/review")).text
    assert "https://llm-proxy.example.com/openai/v1" in review
    assert "https://api.openai.com" not in review

    assert (await enter(client, project_id, csrf, **openai, template="openai-chat-completions")).status_code == 303
    assert "Nothing to add" in (await client.get(f"/admin/projects/{project_id}/add/review")).text
    same = await client.post(f"/admin/projects/{project_id}/add/review", data={"csrf": csrf}, follow_redirects=True)
    assert "Nothing changed: openai already allowed every endpoint of Chat completions." in same.text
    assert "extended" not in same.text

    await integrations.revoke_provider_key(ctx, project_id=project_id, provider="openai", actor="t")
    form = await client.get(f"/admin/projects/{project_id}/add?provider=openai")
    assert ("stored key is kept" in form.text, "its key was revoked" in form.text) == (False, True)
    assert (await enter(client, project_id, csrf, **openai, template="openai-embeddings")).status_code == 303
    review = (await client.get(f"/admin/projects/{project_id}/add/review")).text
    assert ("stored key is kept" in review, "its key was revoked" in review) == (False, True)
    saved = await client.post(f"/admin/projects/{project_id}/add/review", data={"csrf": csrf}, follow_redirects=True)
    assert "openai extended with 1 endpoint of Embeddings; its key was revoked" in saved.text


def auth_groups(page: str) -> dict[str, str]:
    """Each auth field's id → the methods its group is shown for."""
    return {
        field: methods
        for methods, body in re.findall(r'<div class="auth-group" data-auth="([^"]+)">(.*?)</div>', page, re.DOTALL)
        for field in re.findall(r'<(?:input|select) id="(\w+)"', body)
    }


async def test_custom_configure_groups_the_fields_by_method_with_refresh_tokens_and_client_auth(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = (await client.get(f"/admin/projects/{project_id}/custom")).text
    oauth2 = "oauth2_client_credentials oauth2_refresh_token"
    assert auth_groups(page) == {
        "auth_name": "header query",
        "auth_prefix": "header",
        "token_url": f"{oauth2} google_service_account",
        "client_id": oauth2,
        "scope": f"{oauth2} google_service_account",
        "audience": "oauth2_client_credentials",
        "client_auth": "oauth2_client_credentials",
        "region": "aws_sigv4",
        "service": "aws_sigv4",
    }
    assert '.auth-fields:has(#auth_method option[value="header"]:checked)' in CSS.read_text()
    oauth = {"csrf": csrf, "base_url": "https://api.example.com", "api_key": CUSTOM_KEY, "auth_name": "ignored"}
    oauth |= {"token_url": "https://auth.example.com/token", "client_id": "app", "client_auth": "post"}
    for provider, method in (("acme", "oauth2_client_credentials"), ("refreshed", "oauth2_refresh_token")):
        created = await client.post(
            f"/admin/projects/{project_id}/custom", data=oauth | {"provider": provider, "auth_method": method}
        )
        assert created.status_code == 303, field_error(created.text, "auth_method")
    assert (await integrations.get_integration(ctx, project_id=project_id, provider="acme")).auth == {
        "method": "oauth2_client_credentials",
        "token_url": "https://auth.example.com/token",
        "client_id": "app",
        "scope": None,
        "audience": None,
        "client_auth": "post",
    }
    assert (await integrations.get_integration(ctx, project_id=project_id, provider="refreshed")).auth == {
        "method": "oauth2_refresh_token",
        "token_url": "https://auth.example.com/token",
        "client_id": "app",
        "scope": None,
    }


def test_a_word_prefix_gets_the_space_that_follows_it() -> None:
    typed = ("Bearer", "Token ", "key=", "", "  Api-Key", "Bearer  ")
    assert [word_prefix(prefix) for prefix in typed] == ["Bearer ", "Token ", "key=", "", "Api-Key ", "Bearer  "]


async def test_a_word_prefix_is_stored_with_its_space_and_the_header_is_previewed(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    data = {"csrf": csrf, "provider": "acme", "base_url": "https://api.example.com", "api_key": CUSTOM_KEY}
    data |= {"auth_method": "header", "auth_name": "Authorization", "auth_prefix": "Bearer"}
    assert (await client.post(f"/admin/projects/{project_id}/custom", data=data)).status_code == 303
    stored = await integrations.get_integration(ctx, project_id=project_id, provider="acme")
    assert stored.auth == {"method": "header", "name": "Authorization", "prefix": "Bearer "}
    settings = await client.get(f"/admin/projects/{project_id}/integrations/acme")
    assert '<p data-auth="header">' in settings.text
    assert "<code>Authorization: Bearer …wxyz</code>" in settings.text


async def test_settings_change_the_auth_method_its_name_and_prefix(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}/integrations/openai"
    assert '<option value="bearer" selected>' in (await client.get(page)).text
    wrong = settings_form(csrf, auth_method="header", auth_name="api key", auth_prefix="Token")
    refused = await client.post(page, data=wrong)
    assert refused.status_code == 422
    assert shown(field_error(refused.text, "auth_name") or "") == (
        "The header name may hold only letters, digits and !#$%&'*+-.^_`|~ (no space or colon)."
    )
    assert 'value="api key"' in refused.text
    unchanged = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert unchanged.auth == {"method": "bearer"}
    changed = await client.post(page, data=wrong | {"auth_name": "api-key"})
    assert changed.status_code == 303
    stored = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert stored.auth == {"method": "header", "name": "api-key", "prefix": "Token "}


async def test_messages_name_the_field_and_count_lines_from_one(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    data = {"csrf": csrf, "provider": "acme", "base_url": "https://api.example.com", "api_key": CUSTOM_KEY}
    refused = await client.post(f"/admin/projects/{project_id}/custom", data=data | {"auth_method": "header"})
    assert field_error(refused.text, "auth_name") == "The header name is required."
    assert "String should have" not in refused.text
    headers = "OpenAI-Project: p1\nBad Name: x\n"
    settings = f"/admin/projects/{project_id}/integrations/openai"
    page = await client.post(settings, data=settings_form(csrf, headers=headers))
    told = re.search(r'id="headers"[^>]*>[^<]*</textarea>\s*<p class="field-error" role="alert">([^<]+)</p>', page.text)
    assert told is not None
    assert shown(told.group(1)).startswith("Default headers, line 2: the header name may hold only letters")
    assert "is not a valid HTTP header name" not in page.text


def test_the_humaniser_labels_fields_and_numbers_rows_from_one() -> None:
    assert messages.sentence("the base URL", "must start with http:// or https://") == (
        "The base URL must start with http:// or https://."
    )
    assert messages.sentence("the prefix", "a header value may not hold line breaks") == (
        "The prefix may not hold line breaks."
    )
    assert messages.sentence(None, "header Host is set by the transport", where="Line 1") == (
        "Line 1: header Host is set by the transport."
    )


async def test_one_bad_endpoint_row_keeps_every_row_as_typed_and_saves_nothing(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}/integrations/openai/endpoints"
    typed = {"csrf": csrf, "method": ["POST", "GET", "GET", "POST"]}
    typed["path"] = ["chat/completions", "models", "a/../b", ""]
    refused = await client.post(page, data=typed)
    assert refused.status_code == 422
    assert re.findall(r'<input name="path" value="([^"]*)"', refused.text) == [
        "chat/completions",
        "models",
        "a/../b",
        "",
        "",
        "",
    ]
    assert 'aria-label="Path of row 3" aria-invalid="true"' in refused.text
    assert "Row 3: the path may not hold &#39;.&#39; or &#39;..&#39; segments." in refused.text
    assert "Nothing was saved: fix row 3, then save again." in refused.text
    stored = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert stored.endpoints == [{"method": "POST", "path": "chat/completions"}]
    fixed = await client.post(page, data=typed | {"path": ["chat/completions", "models", "files/*", ""]})
    assert fixed.status_code == 303
    stored = await integrations.get_integration(ctx, project_id=project_id, provider="openai")
    assert [endpoint["path"] for endpoint in stored.endpoints] == ["chat/completions", "models", "files/*"]
