"""CORS on real sockets: preflights answered before any token for an origin some project lists, responses to a
listed origin readable by its pages, every other origin refused; server-side clients see no change."""

import httpx
import pytest

from credgate.services import projects
from credgate.services.context import Context
from credgate.services.projects import ProjectChanges
from tests.e2e.conftest import Project, add_custom, add_project
from tests.upstream import Upstream, run_raw_upstream

APP = "https://app.example"
OTHER = "https://other.example"
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


async def allow(ctx: Context, project: Project, *origins: str) -> None:
    changes = ProjectChanges(allowed_origins=list(origins))
    await projects.update_project(ctx, project_id=project.id, changes=changes, actor="t")


async def preflight(gateway_url: str, origin: str, method: str = "POST", headers: str = "") -> httpx.Response:
    asked = {"origin": origin, "access-control-request-method": method}
    if headers:
        asked["access-control-request-headers"] = headers
    async with httpx.AsyncClient(base_url=gateway_url) as client:
        return await client.options("/proxy/openai/chat/completions", headers=asked)


async def chat(gateway_url: str, token: str, origin: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} | ({"origin": origin} if origin else {})
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
        return await client.post("/proxy/openai/chat/completions", headers=headers, json=CHAT)


async def test_a_preflight_from_a_listed_origin_is_answered_before_any_token(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    await allow(ctx, project, APP)

    answer = await preflight(gateway_url, APP, headers="authorization, content-type, x-stainless-os")

    assert answer.status_code == 204
    assert answer.headers["access-control-allow-origin"] == APP
    assert "POST" in answer.headers["access-control-allow-methods"]
    assert answer.headers["access-control-allow-headers"] == "authorization, content-type, x-stainless-os"
    assert int(answer.headers["access-control-max-age"]) > 0
    assert "Origin" in answer.headers["vary"]
    assert upstream.received == []  # answered by credgate, never forwarded


@pytest.mark.parametrize("origin", [OTHER, "null", "https://app.example.evil", "http://app.example"])
async def test_a_preflight_from_an_origin_no_project_lists_is_refused(
    gateway_url: str, ctx: Context, project: Project, origin: str
) -> None:
    await allow(ctx, project, APP)
    answer = await preflight(gateway_url, origin)
    assert answer.status_code == 403
    assert "access-control-allow-origin" not in answer.headers


async def test_a_response_to_a_listed_origin_is_readable_by_its_pages(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    await allow(ctx, project, APP)

    response = await chat(gateway_url, project.token, APP)

    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == APP
    exposed = {name.strip() for name in response.headers["access-control-expose-headers"].split(",")}
    assert {"x-credgate-request-id", "x-request-id"} <= exposed
    assert "Origin" in response.headers.get_list("vary")


async def test_a_request_from_an_origin_the_project_does_not_list_is_refused(
    gateway_url: str, ctx: Context, project: Project, upstream: Upstream
) -> None:
    other = await add_project(ctx, upstream)
    await allow(ctx, project, APP)
    await allow(ctx, other, OTHER)  # listed, but by another project: the preflight passes, the request does not

    response = await chat(gateway_url, project.token, OTHER)

    assert response.status_code == 403
    assert response.json()["error"]["message"] == "this page's origin is not allowed to call this project"
    assert "access-control-allow-origin" not in response.headers
    assert upstream.received == []


async def test_a_401_to_a_listed_origin_is_readable_so_a_page_can_mint_again(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    await allow(ctx, project, APP)
    response = await chat(gateway_url, "cgc_expired.x", APP)
    assert response.status_code == 401
    assert response.headers["access-control-allow-origin"] == APP


async def test_a_client_token_is_held_to_its_own_origins_within_the_projects(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    await allow(ctx, project, APP, OTHER)
    async with httpx.AsyncClient(base_url=gateway_url) as client:
        minted = await client.post(
            "/api/v1/client-tokens", headers={"authorization": f"Bearer {project.token}"}, json={"origins": [APP]}
        )
    token = minted.json()["token"]

    assert (await chat(gateway_url, token, APP)).status_code == 200
    assert (await chat(gateway_url, token, OTHER)).status_code == 403
    # Origins restrain pages; a server-side client sends none, and is held to the rest of the scope.
    assert (await chat(gateway_url, token)).status_code == 200


async def test_a_project_that_removes_an_origin_refuses_it_at_once(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    await allow(ctx, project, APP)
    assert (await chat(gateway_url, project.token, APP)).status_code == 200
    await allow(ctx, project)
    assert (await preflight(gateway_url, APP)).status_code == 403
    assert (await chat(gateway_url, project.token, APP)).status_code == 403


async def test_a_server_side_client_sees_no_cors_headers(gateway_url: str, ctx: Context, project: Project) -> None:
    await allow(ctx, project, APP)
    response = await chat(gateway_url, project.token)
    assert response.status_code == 200
    assert not [name for name in response.headers if name.startswith("access-control-")]
    assert "vary" not in response.headers


async def test_the_providers_own_cors_headers_never_reach_a_page(
    gateway_url: str, ctx: Context, project: Project
) -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\naccess-control-allow-origin: *\r\n"
        b"access-control-allow-credentials: true\r\nx-provider-thing: 1\r\ncontent-length: 2\r\n\r\n{}"
    )
    async with run_raw_upstream([answer]) as raw:
        await add_custom(ctx, project, "raw", raw.url)
        await allow(ctx, project, APP)
        async with httpx.AsyncClient(base_url=gateway_url) as client:
            response = await client.get(
                "/proxy/raw/anything", headers={"authorization": f"Bearer {project.token}", "origin": APP}
            )
    assert response.status_code == 200
    assert response.headers.get_list("access-control-allow-origin") == [APP]
    assert "access-control-allow-credentials" not in response.headers
    assert "x-provider-thing" in response.headers["access-control-expose-headers"]


async def test_a_plain_options_request_is_still_forwarded(gateway_url: str, ctx: Context, project: Project) -> None:
    """Without Access-Control-Request-Method an OPTIONS is not a preflight: it needs a token and is proxied."""
    await allow(ctx, project, APP)
    async with httpx.AsyncClient(base_url=gateway_url) as client:
        unauthenticated = await client.options("/proxy/openai/chat/completions", headers={"origin": APP})
    assert unauthenticated.status_code == 401


@pytest.mark.parametrize(
    ("origins", "message"),
    [
        (["https://app.example/path"], "allowed_origins.0: must be scheme://host[:port] alone, with no path"),
        (["ftp://app.example"], "allowed_origins.0: must be scheme://host[:port], with http or https"),
        (["*"], "allowed_origins.0: must be scheme://host[:port], with http or https"),
    ],
)
async def test_an_origin_that_is_not_one_is_refused_naming_the_field(
    ctx: Context, project: Project, origins: list[str], message: str
) -> None:
    from credgate.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        await allow(ctx, project, *origins)
    assert str(refused.value) == message


async def test_origins_are_kept_as_browsers_send_them(ctx: Context, project: Project) -> None:
    await allow(ctx, project, "HTTPS://App.Example:443/", "http://127.0.0.1:8000", "https://app.example")
    found = await projects.get_project(ctx, project_id=project.id)
    assert found.allowed_origins == ["https://app.example", "http://127.0.0.1:8000"]
