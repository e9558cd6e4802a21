"""The panel's browser and end-user settings: allowed origins (normalised, a bad line named and the text kept), each
end user's rate limit, the identity provider (all or nothing, one issuer and audience per project); budgets per
end user; usage totals by end user."""

import html
import re
from datetime import UTC, datetime

import httpx

from credgate.services import budgets, projects
from credgate.services.context import Context
from credgate.services.usage import ProxiedRequest, UsageRecorder
from credgate.specs import IdentityProviderSpec
from tests.admin_ui.test_security import signed_in_csrf

BLANK = {"allowed_origins": "", "subject_rate_limit_per_minute": "", "jwks_url": "", "issuer": "", "audience": ""}
IDP = {"jwks_url": "https://login.example.com/jwks.json", "issuer": "https://login.example.com/", "audience": "app"}


async def post_end_users(client: httpx.AsyncClient, project_id: str, **typed: str) -> httpx.Response:
    csrf = await signed_in_csrf(client)
    form = {"csrf": csrf} | BLANK | typed
    return await client.post(f"/admin/projects/{project_id}/end-users", data=form, follow_redirects=True)


def shown_origins(page: str) -> str:
    match = re.search(r'<textarea id="allowed_origins"[^>]*>([^<]*)</textarea>', page)
    assert match is not None
    return html.unescape(match.group(1))


def value_of(page: str, name: str) -> str:
    match = re.search(rf'<input id="{name}" name="{name}"[^>]* value="([^"]*)"', page)
    assert match is not None
    return html.unescape(match.group(1))


async def test_origins_are_saved_normalised_shown_back_and_cleared(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    typed = "HTTPS://App.Example.com:443/\n\nhttp://localhost:3000\nhttps://app.example.com"
    saved = await post_end_users(client, project_id, allowed_origins=typed)
    assert "Browser and end-user settings saved." in saved.text
    assert shown_origins(saved.text) == "https://app.example.com\nhttp://localhost:3000"
    assert (await projects.get_project(ctx, project_id=project_id)).allowed_origins == [
        "https://app.example.com",
        "http://localhost:3000",
    ]

    cleared = await post_end_users(client, project_id, allowed_origins="  \n")
    assert shown_origins(cleared.text) == ""
    assert (await projects.get_project(ctx, project_id=project_id)).allowed_origins == []


async def test_a_bad_origin_is_told_by_its_line_and_what_was_typed_is_kept(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    await post_end_users(client, project_id, allowed_origins="https://kept.example.com")
    typed = "https://app.example.com\n\nhttps://app.example.com/login"
    refused = await post_end_users(client, project_id, allowed_origins=typed, subject_rate_limit_per_minute="7")
    assert refused.status_code == 422
    assert "Line 3 must be scheme://host[:port] alone, with no path." in refused.text
    assert (shown_origins(refused.text), value_of(refused.text, "subject_rate_limit_per_minute")) == (typed, "7")
    after = await projects.get_project(ctx, project_id=project_id)
    assert (after.allowed_origins, after.subject_rate_limit_per_minute) == (["https://kept.example.com"], None)


async def test_the_project_settings_form_leaves_the_end_user_settings_as_they_are(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    await post_end_users(client, project_id, allowed_origins="https://app.example.com", **IDP)
    form = {
        "csrf": await signed_in_csrf(client),
        "name": "renamed",
        "rate_limit_per_minute": "",
        "key_max_age_days": "",
    }
    assert (await client.post(f"/admin/projects/{project_id}", data=form)).status_code == 303
    after = await projects.get_project(ctx, project_id=project_id)
    assert (after.name, after.allowed_origins, after.identity_provider) == ("renamed", ["https://app.example.com"], IDP)


async def test_each_end_users_rate_limit_is_set_refused_out_of_range_and_turned_off(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    saved = await post_end_users(client, project_id, subject_rate_limit_per_minute="30")
    assert value_of(saved.text, "subject_rate_limit_per_minute") == "30"
    assert (await projects.get_project(ctx, project_id=project_id)).subject_rate_limit_per_minute == 30

    refused = await post_end_users(client, project_id, subject_rate_limit_per_minute="0")
    assert refused.status_code == 422
    assert "Must be a whole number from 1 to 1000000." in refused.text
    assert value_of(refused.text, "subject_rate_limit_per_minute") == "0"

    cleared = await post_end_users(client, project_id)
    assert value_of(cleared.text, "subject_rate_limit_per_minute") == ""
    assert (await projects.get_project(ctx, project_id=project_id)).subject_rate_limit_per_minute is None


async def test_an_identity_provider_is_trusted_shown_and_cleared(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    saved = await post_end_users(client, project_id, **IDP)
    assert "Browser and end-user settings saved." in saved.text
    assert {name: value_of(saved.text, name) for name in IDP} == IDP
    assert (await projects.get_project(ctx, project_id=project_id)).identity_provider == IDP

    cleared = await post_end_users(client, project_id)
    assert [value_of(cleared.text, name) for name in IDP] == ["", "", ""]
    assert (await projects.get_project(ctx, project_id=project_id)).identity_provider is None


async def test_a_partial_or_bad_identity_provider_says_what_is_wrong_and_keeps_what_was_typed(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    partial = await post_end_users(client, project_id, jwks_url=IDP["jwks_url"])
    assert partial.status_code == 422
    assert "The issuer and the audience are missing: fill in all three" in partial.text
    assert value_of(partial.text, "jwks_url") == IDP["jwks_url"]

    bad_url = await post_end_users(client, project_id, **IDP | {"jwks_url": "login.example.com/jwks"})
    assert bad_url.status_code == 422
    assert "Must start with http:// or https://." in bad_url.text
    assert value_of(bad_url.text, "audience") == "app"
    assert (await projects.get_project(ctx, project_id=project_id)).identity_provider is None


async def test_an_issuer_and_audience_another_project_trusts_are_refused(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    other, _ = await projects.create_project(ctx, name="other", actor="t")
    changes = projects.ProjectChanges(identity_provider=IdentityProviderSpec(**IDP))
    await projects.update_project(ctx, project_id=other.id, changes=changes, actor="t")

    refused = await post_end_users(client, project_id, **IDP | {"jwks_url": "https://elsewhere.example.com/jwks"})
    assert refused.status_code == 409
    assert f"Project {other.id} already trusts this issuer for this audience." in refused.text
    assert value_of(refused.text, "jwks_url") == "https://elsewhere.example.com/jwks"
    assert (await projects.get_project(ctx, project_id=project_id)).identity_provider is None


def budget_rows(page: str) -> list[str]:
    body = page.split('<table class="budgets">', 1)[1].split("</table>", 1)[0]
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip() for row in body.split("<tr>")[2:]]


async def test_a_budget_per_end_user_is_added_and_listed_as_such(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    csrf = await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}/budgets"
    form = {"csrf": csrf, "metric": "requests", "limit": "100", "period": "day", "provider": "", "per_subject": "on"}
    refused = await client.post(page, data=form | {"limit": "lots"})
    assert refused.status_code == 422
    assert re.search(r'<input type="checkbox" id="per_subject" name="per_subject" checked', refused.text)

    added = await client.post(page, data=form, follow_redirects=True)
    assert "each end user's requests over it get 402" in html.unescape(added.text)
    await client.post(page, data=form | {"per_subject": ""})
    rows = budget_rows((await client.get(page)).text)
    assert [row.split(" all ")[0] for row in rows] == ["Requests a day per end user", "Requests a day"]
    assert [state.budget.per_subject for state in await budgets.list_budgets(ctx, project_id=project_id)] == [
        True,
        False,
    ]


def totals(page: str) -> list[str]:
    body = page.split('<table class="totals">', 1)[1].split("</table>", 1)[0]
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip() for row in body.split("<tr>")[2:]]


async def test_usage_is_grouped_by_end_user_with_the_project_tokens_requests_apart(
    client: httpx.AsyncClient, ctx: Context, project_id: str
) -> None:
    recorder = UsageRecorder(ctx)
    for subject in ("alice", "alice", None, "bob", "alice"):
        at = datetime.now(UTC)
        recorder.record(ProxiedRequest(at, project_id, "h", "r", "POST", "openai", "chat", 200, subject=subject))
    await recorder.flush()
    await signed_in_csrf(client)
    page = f"/admin/projects/{project_id}/usage"

    by_subject = await client.get(page, params={"by": "subject"})
    assert totals(by_subject.text) == ["alice 3 0 0 0", "(project token) 1 0 0 0", "bob 1 0 0 0"]
    assert '<option value="subject" selected>End user</option>' in by_subject.text
    for default in ({}, {"by": "nonsense"}):
        assert totals((await client.get(page, params=default)).text) == ["openai 5 0 0 0"]
