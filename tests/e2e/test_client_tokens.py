"""Client tokens on real sockets: minted with a project token, scoped, short-lived, dead with the token that
minted them, never able to mint; the subject recorded and limited per end user."""

import asyncio
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx
import pytest

from credgate import crypto
from credgate.app import create_app
from credgate.config import Settings
from credgate.error_responses import ErrorOut
from credgate.proxy.minting import MintedToken
from credgate.services import budgets, master_keys, projects, usage
from credgate.services.context import Context
from credgate.services.projects import ProjectChanges
from tests.e2e.conftest import Project, add_project, bearer
from tests.upstream import Upstream

CHAT: Mapping[str, object] = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
IMAGE: Mapping[str, object] = {"prompt": "a lighthouse"}


async def mint(gateway_url: str, token: str, **scope: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
        return await client.post("/api/v1/client-tokens", headers={"authorization": f"Bearer {token}"}, json=scope)


async def minted(gateway_url: str, project: Project, **scope: Any) -> str:
    response = await mint(gateway_url, project.token, **scope)
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


async def call(
    gateway_url: str, token: str, path: str = "chat/completions", body: Mapping[str, object] = CHAT, **headers: str
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
        return await client.post(
            f"/proxy/openai/{path}", headers={"authorization": f"Bearer {token}", **headers}, json=body
        )


async def records(ctx: Context, project: Project, count: int) -> list[Any]:
    for _ in range(200):
        found = await usage.list_request_records(ctx, project_id=project.id)
        if len(found) >= count:
            return list(found)
        await asyncio.sleep(0.02)
    raise AssertionError(f"fewer than {count} requests were recorded")


async def test_a_minted_token_calls_the_provider_with_the_key_and_records_its_subject(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    before = time.time()
    answer = await mint(gateway_url, project.token, subject="user-42", ttl_seconds=600)

    assert answer.status_code == 201
    assert answer.headers["cache-control"] == "no-store"
    token, expires_at = answer.json()["token"], answer.json()["expires_at"]
    assert token.startswith("cgc_")
    assert project.token not in token

    # The whole ttl, to the millisecond: a whole-second expiry would cut up to a second off it.
    assert before + 599.999 <= datetime.fromisoformat(expires_at).timestamp() <= time.time() + 600.001
    response = await call(gateway_url, token)
    assert response.status_code == 200
    assert upstream.last.header("authorization") == f"Bearer {project.key}"
    assert token not in str(upstream.last.headers)
    [record] = await records(ctx, project, 1)
    assert record.subject == "user-42"


async def test_a_token_reaches_only_the_providers_and_endpoints_it_names(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await add_project(ctx, upstream, provider="second")  # another project: its integration is not this one's
    chat_only = await minted(gateway_url, project, endpoints=[{"method": "POST", "path": "chat/completions"}])
    assert (await call(gateway_url, chat_only)).status_code == 200
    refused = await call(gateway_url, chat_only, "images/generations", IMAGE)
    assert refused.status_code == 403
    assert "outside this client token's scope" in refused.json()["error"]["message"]

    openai_only = await minted(gateway_url, project, providers=["openai"])
    assert (await call(gateway_url, openai_only, "images/generations", IMAGE)).status_code == 200
    # A scope wider than the integration's allow-list does not widen it.
    everything = await minted(gateway_url, project, endpoints=[{"method": "*", "path": "**"}])
    assert (await call(gateway_url, everything, "models/secret", {})).status_code == 403


async def test_a_token_for_one_provider_is_refused_at_another(
    gateway_url: str, ctx: Context, upstream: Upstream
) -> None:
    project = await add_project(ctx, upstream)
    await add_project_provider(ctx, project, upstream, "backup")
    token = await minted(gateway_url, project, providers=["backup"])
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
        ok = await client.post(
            "/proxy/backup/chat/completions", headers={"authorization": f"Bearer {token}"}, json=CHAT
        )
        refused = await client.post(
            "/proxy/openai/chat/completions", headers={"authorization": f"Bearer {token}"}, json=CHAT
        )
    assert ok.status_code == 200
    assert refused.status_code == 403


async def add_project_provider(ctx: Context, project: Project, upstream: Upstream, provider: str) -> None:
    from credgate.services import integrations

    await integrations.add_template_integration(
        ctx,
        project_id=project.id,
        provider=provider,
        template_id="openai-chat-completions",
        actor="tests",
        api_key=project.key,
        base_url=f"{upstream.url}/v1",
    )


async def test_a_token_stops_at_its_expiry(gateway_url: str, project: Project) -> None:
    token = await minted(gateway_url, project, ttl_seconds=1)
    assert (await call(gateway_url, token)).status_code == 200
    await asyncio.sleep(1.2)
    expired = await call(gateway_url, token)
    assert expired.status_code == 401
    assert expired.headers["www-authenticate"].startswith("Bearer")


async def test_a_master_key_rotation_ends_the_tokens_signed_before_it_even_once_remembered(
    gateway_url: str, ctx: Context, settings: Settings, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rotation is what an admin does when the master key may have leaked: a token signed under the old key
    (or forged with it) must stop, in a worker that has checked it already too."""
    token = await minted(gateway_url, project)
    assert (await call(gateway_url, token)).status_code == 200  # checked, and remembered

    await master_keys.rotate_master_key(ctx, settings, actor="t")
    monkeypatch.setattr(crypto, "_TAG_REFRESH_SECONDS", 0)  # the key file re-read at once, not within 10 s
    refused = await call(gateway_url, token)
    assert refused.status_code == 401
    assert (await call(gateway_url, await minted(gateway_url, project))).status_code == 200


@pytest.mark.parametrize("ending", ["rotate", "revoke", "delete"])
async def test_a_token_dies_with_the_project_token_that_minted_it(
    gateway_url: str, ctx: Context, project: Project, ending: str
) -> None:
    token = await minted(gateway_url, project)
    assert (await call(gateway_url, token)).status_code == 200

    if ending == "rotate":
        await projects.rotate_project_token(ctx, project_id=project.id, actor="t", grace_seconds=0)
    elif ending == "revoke":
        await projects.revoke_project_tokens(ctx, project_id=project.id, actor="t")
    else:
        await projects.delete_project(ctx, project_id=project.id, actor="t")

    assert (await call(gateway_url, token)).status_code == 401


async def test_a_token_minted_during_a_rotations_grace_lives_while_the_grace_does(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    _, new_token = await projects.rotate_project_token(ctx, project_id=project.id, actor="t", grace_seconds=60)
    by_old = await minted(gateway_url, project)
    by_new = await minted(gateway_url, Project(project.id, new_token, project.key))
    assert (await call(gateway_url, by_old)).status_code == 200
    await projects.rotate_project_token(ctx, project_id=project.id, actor="t", grace_seconds=0)
    assert (await call(gateway_url, by_old)).status_code == 401
    assert (await call(gateway_url, by_new)).status_code == 401  # rotated away too, with no grace


async def test_a_token_never_outlives_the_project_token_that_minted_it(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    _, short = await projects.rotate_project_token(ctx, project_id=project.id, actor="t", expires_in_seconds=60)
    answer = await mint(gateway_url, short, ttl_seconds=86_400)

    assert datetime.fromisoformat(answer.json()["expires_at"]).timestamp() <= time.time() + 61


async def test_only_a_project_token_mints(gateway_url: str, ctx: Context, project: Project) -> None:
    token = await minted(gateway_url, project)
    refused = await mint(gateway_url, token)
    assert refused.status_code == 403
    assert refused.json()["error"]["message"] == "only a project token can mint client tokens"
    assert (await mint(gateway_url, "cgp_unknown")).status_code == 401
    async with httpx.AsyncClient(base_url=gateway_url) as client:
        assert (await client.post("/api/v1/client-tokens", json={})).status_code == 401
        wrong = await client.get("/api/v1/client-tokens", headers={"authorization": f"Bearer {project.token}"})
        assert wrong.status_code == 405
        assert wrong.headers["allow"] == "POST"


async def test_the_admin_apis_openapi_document_describes_the_mint_as_it_answers(
    gateway_url: str, project: Project
) -> None:
    document = create_app(Settings.model_construct()).control.openapi()
    operation = document["paths"]["/api/v1/client-tokens"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"] == ref("MintRequest")
    assert operation["responses"]["201"]["content"]["application/json"]["schema"] == ref("MintedToken")
    MintedToken.model_validate((await mint(gateway_url, project.token, ttl_seconds=60)).json())  # no field more
    async with httpx.AsyncClient(base_url=gateway_url) as client:
        refusals = [
            await mint(gateway_url, "cgp_unknown"),
            await mint(gateway_url, await minted(gateway_url, project)),
            await mint(gateway_url, project.token, ttl_seconds=0),
            await client.get("/api/v1/client-tokens", headers={"authorization": f"Bearer {project.token}"}),
            await client.post("/api/v1/client-tokens", content=b"x" * (65 * 1024), headers=bearer(project.token)),
        ]
    assert [refused.status_code for refused in refusals] == [401, 403, 422, 405, 413]
    for refused in refusals:
        assert operation["responses"][str(refused.status_code)]["content"]["application/json"]["schema"] == ref(
            "ErrorOut"
        )
        ErrorOut.model_validate(refused.json())


def ref(schema: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{schema}"}


@pytest.mark.parametrize(
    ("scope", "field"),
    [
        ({"ttl_seconds": 0}, "ttl_seconds"),
        ({"ttl_seconds": 86_401}, "ttl_seconds"),
        ({"ttl_seconds": "60"}, "ttl_seconds"),
        ({"providers": ["elsewhere"]}, "providers.0"),
        ({"providers": ["Bad Name"]}, "providers.0"),
        ({"origins": ["https://app.example"]}, "origins.0"),  # not among the project's allowed origins
        ({"origins": ["https://app.example/path"]}, "origins.0"),
        ({"endpoints": [{"method": "BREW", "path": "x"}]}, "endpoints.0.method"),
        ({"subject": ""}, "subject"),
        ({"subject": "a\nb"}, "subject"),
        ({"subject": "x" * 201}, "subject"),
        ({"scope": "all"}, "scope"),
    ],
)
async def test_a_scope_outside_the_projects_is_refused_with_the_field_named(
    gateway_url: str, project: Project, scope: dict[str, Any], field: str
) -> None:
    refused = await mint(gateway_url, project.token, **scope)
    assert refused.status_code == 422
    assert refused.headers["x-credgate-error"] == "true"
    assert refused.json()["error"]["message"].startswith(f"{field}: ")


async def test_a_scope_too_large_for_a_header_is_refused_when_minted(gateway_url: str, project: Project) -> None:
    endpoints = [{"method": "POST", "path": f"v1/endpoint-{index}/**"} for index in range(300)]
    refused = await mint(gateway_url, project.token, endpoints=endpoints)
    assert refused.status_code == 422
    assert refused.json()["error"]["message"].startswith("endpoints: the scope makes a token over 4096 characters")


async def test_an_unknown_token_is_told_401_before_its_body_is_judged(gateway_url: str) -> None:
    assert (await mint(gateway_url, "cgp_unknown", ttl_seconds=0)).status_code == 401


async def test_a_body_that_is_not_json_is_refused(gateway_url: str, project: Project) -> None:
    async with httpx.AsyncClient(base_url=gateway_url) as client:
        refused = await client.post(
            "/api/v1/client-tokens", headers={"authorization": f"Bearer {project.token}"}, content=b"{not json"
        )
    assert refused.status_code == 422


async def test_an_altered_or_forged_token_is_refused(gateway_url: str, project: Project) -> None:
    token = await minted(gateway_url, project, providers=["openai"], endpoints=[{"method": "POST", "path": "x"}])
    payload, _, tag = token.partition(".")
    tampered = payload[:-2] + ("A" if payload[-2] != "A" else "B") + payload[-1] + "." + tag
    assert (await call(gateway_url, tampered)).status_code == 401
    assert (await call(gateway_url, payload + ".")).status_code == 401
    assert (await call(gateway_url, "cgc_e30." + tag)).status_code == 401
    # Other spellings of the same bytes are not the token: a lenient decoder would take each as a new one.
    for spelling in (token + "!!", token + "==", f"{payload}.{tag[:10]}~~{tag[10:]}", f"{payload}=.{tag}"):
        assert (await call(gateway_url, spelling)).status_code == 401
    assert (await call(gateway_url, token)).status_code == 403  # the token itself: valid, but scoped elsewhere


async def test_each_end_user_has_a_rate_limit_of_their_own(gateway_url: str, ctx: Context, project: Project) -> None:
    await projects.update_project(
        ctx, project_id=project.id, changes=ProjectChanges(subject_rate_limit_per_minute=2), actor="t"
    )
    alice = await minted(gateway_url, project, subject="alice")
    bob = await minted(gateway_url, project, subject="bob")

    statuses = [(await call(gateway_url, alice)).status_code for _ in range(3)]
    limited = await call(gateway_url, alice)

    assert statuses == [200, 200, 429]
    assert "per end user" in limited.json()["error"]["message"]
    assert int(limited.headers["retry-after"]) >= 1
    assert (await call(gateway_url, bob)).status_code == 200
    assert (await call(gateway_url, project.token)).status_code == 200  # the project's own calls: no end user


async def test_an_end_user_over_their_limit_does_not_spend_the_projects(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    changes = ProjectChanges(subject_rate_limit_per_minute=1, rate_limit_per_minute=3)
    await projects.update_project(ctx, project_id=project.id, changes=changes, actor="t")
    alice = await minted(gateway_url, project, subject="alice")

    assert [(await call(gateway_url, alice)).status_code for _ in range(6)] == [200, 429, 429, 429, 429, 429]
    bob = await minted(gateway_url, project, subject="bob")
    assert (await call(gateway_url, bob)).status_code == 200
    assert (await call(gateway_url, project.token)).status_code == 200  # 3 of the project's 3: alice spent one


async def test_a_per_subject_budget_holds_for_each_end_user_apart(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    await budgets.add_budget(
        ctx, project_id=project.id, metric="requests", limit=2, period="day", per_subject=True, actor="t"
    )
    alice = await minted(gateway_url, project, subject="alice")
    bob = await minted(gateway_url, project, subject="bob")

    assert [(await call(gateway_url, alice)).status_code for _ in range(3)] == [200, 200, 402]
    spent = await call(gateway_url, alice)
    assert "for each end user" in spent.json()["error"]["message"]
    assert (await call(gateway_url, bob)).status_code == 200
    assert [(await call(gateway_url, project.token)).status_code for _ in range(3)] == [200, 200, 200]
    await records(ctx, project, 7)
    [state] = await budgets.list_budgets(ctx, project_id=project.id)
    assert state.spent == 2  # the end user who spent the most: alice


async def test_usage_groups_by_end_user(gateway_url: str, ctx: Context, project: Project) -> None:
    for subject, count in (("alice", 2), ("bob", 1)):
        token = await minted(gateway_url, project, subject=subject)
        for _ in range(count):
            assert (await call(gateway_url, token)).status_code == 200
    assert (await call(gateway_url, project.token)).status_code == 200
    await records(ctx, project, 4)
    _, _, rows = await usage.summarize_usage(ctx, project_id=project.id, since=None, until=None, group_by="subject")
    assert {row.group: row.requests for row in rows} == {"alice": 2, "bob": 1, "": 1}
