"""Admin API input at and beyond its limits: every number, time and name out of range is a 422 that names the
field and never quotes the value (no overflow deep inside turns into a 500), and changes nothing; a path that
could name nothing is a 404."""

from typing import Any

import httpx
import pytest

from credgate.limits import (
    MAX_ACTOR_LENGTH,
    MAX_CONCURRENT_REQUESTS,
    MAX_GRACE,
    MAX_NAME_LENGTH,
    MAX_RATE_LIMIT_PER_MINUTE,
    MAX_TIMEOUT_SECONDS,
    MAX_TOKEN_LIFETIME,
    MAX_TOTAL_TIMEOUT_SECONDS,
)
from credgate.services import admins
from credgate.services.context import Context
from tests.admin_api.test_error_shape import CUSTOM, service_error

# Raw JSON, so that what json.dumps cannot write (1e400, NaN) is sent too.
NOT_A_NUMBER_IN_RANGE = [
    str(2**64),
    str(2**70),
    "-1",
    "1e400",
    "-1e400",
    "1e308",
    "NaN",
    "Infinity",
    "-Infinity",
    '"30"',
    '"1e400"',
    '"NaN"',
    "true",
    "[]",
    "{}",
]
# Each numeric field of the admin API, where it is sent, and the first whole value above its range.
NUMERIC_FIELDS = [
    ("PATCH", "", "rate_limit_per_minute", MAX_RATE_LIMIT_PER_MINUTE + 1),
    ("PATCH", "", "max_concurrent_requests", MAX_CONCURRENT_REQUESTS + 1),
    ("POST", "/token/rotate", "grace_seconds", int(MAX_GRACE.total_seconds()) + 1),
    ("POST", "/token/rotate", "expires_in_seconds", int(MAX_TOKEN_LIFETIME.total_seconds()) + 1),
    ("PATCH", "/integrations/acme", "timeout_seconds", MAX_TIMEOUT_SECONDS + 1),
    ("PATCH", "/integrations/acme", "stream_idle_timeout_seconds", MAX_TIMEOUT_SECONDS + 1),
    ("PATCH", "/integrations/acme", "total_timeout_seconds", MAX_TOTAL_TIMEOUT_SECONDS + 1),
]


async def project_with_integration(client: httpx.AsyncClient) -> str:
    created = await client.post("/api/v1/projects", json={"name": "demo"})
    project_id: str = created.json()["project"]["id"]
    assert (await client.post(f"/api/v1/projects/{project_id}/integrations", json=CUSTOM)).status_code == 201
    return project_id


async def state(client: httpx.AsyncClient, project_id: str) -> list[Any]:
    project = f"/api/v1/projects/{project_id}"
    return [(await client.get(path)).json() for path in (project, f"{project}/integrations/acme")]


def refused(response: httpx.Response, field: str, sent: str) -> None:
    message = service_error(response, 422)
    assert message.startswith(f"{field}: "), message
    if len(sent) > 4:
        assert sent.strip('"') not in message


@pytest.mark.parametrize(("method", "suffix", "field", "above"), NUMERIC_FIELDS, ids=[f[2] for f in NUMERIC_FIELDS])
async def test_every_numeric_field_refuses_what_is_not_a_number_in_its_range(
    client: httpx.AsyncClient, method: str, suffix: str, field: str, above: int
) -> None:
    project_id = await project_with_integration(client)
    before = await state(client, project_id)
    for sent in [*NOT_A_NUMBER_IN_RANGE, str(above)]:
        response = await client.request(
            method,
            f"/api/v1/projects/{project_id}{suffix}",
            content=f'{{"{field}": {sent}}}',
            headers={"Content-Type": "application/json"},
        )
        refused(response, field, sent)
    assert await state(client, project_id) == before


@pytest.mark.parametrize("path", ["/requests", "/audit"])
async def test_a_list_limit_out_of_range_is_refused(client: httpx.AsyncClient, path: str) -> None:
    project_id = await project_with_integration(client)
    url = f"/api/v1/projects/{project_id}/requests" if path == "/requests" else "/api/v1/audit"
    for sent in [str(2**64), str(2**70), "-1", "0", "1001", "1e400", "nan", "inf", "1.5", "true", "ten"]:
        refused(await client.get(url, params={"limit": sent}), "limit", sent)
    assert (await client.get(url, params={"limit": "1000"})).status_code == 200


async def test_a_usage_window_beyond_the_calendar_is_refused(client: httpx.AsyncClient) -> None:
    project_id = await project_with_integration(client)
    for name in ("since", "until"):
        for sent in [
            "0001-01-01T00:00:00+00:00",
            "0001-01-01T00:00:00+23:59",
            "9999-12-31T23:59:59-23:59",
            "1969-12-31T23:59:59+00:00",
            "2024-01-01T00:00:00",  # no zone offset
            "1e400",
        ]:
            response = await client.get(f"/api/v1/projects/{project_id}/usage", params={name: sent})
            refused(response, name, sent)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"name": ""}', "name"),
        ('{"name": "' + "n" * 201 + '"}', "name"),
        ('{"name": "a\\u0000b"}', "name"),
        ('{"name": "line\\nbreak"}', "name"),
        ('{"name": "\\ud800"}', "name"),
        ('{"name": 7}', "name"),
    ],
)
async def test_a_project_name_out_of_its_limits_is_refused(client: httpx.AsyncClient, body: str, field: str) -> None:
    response = await client.post("/api/v1/projects", content=body, headers={"Content-Type": "application/json"})
    refused(response, field, "")
    assert (await client.get("/api/v1/projects")).json() == {"items": []}


async def test_unpaired_surrogates_are_refused_wherever_text_is_stored(client: httpx.AsyncClient) -> None:
    project_id = await project_with_integration(client)
    before = await state(client, project_id)
    for field, value in [("headers", '{"x-team": "\\udc00"}'), ("query", '{"a": "\\ud800"}')]:
        response = await client.patch(
            f"/api/v1/projects/{project_id}/integrations/acme",
            content=f'{{"{field}": {value}}}',
            headers={"Content-Type": "application/json"},
        )
        refused(response, field, "")
    assert await state(client, project_id) == before


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/projects/prj_%00",
        "/api/v1/projects/%ED%A0%80",
        "/api/v1/projects/" + "p" * 300,
        "/api/v1/projects/{project_id}/integrations/a%00b",
        "/api/v1/projects/{project_id}/integrations/%F0%9F%94%91",
        "/api/v1/projects/{project_id}/integrations/" + "a" * 64,
    ],
)
async def test_a_path_that_could_name_nothing_is_404(client: httpx.AsyncClient, path: str) -> None:
    project_id = await project_with_integration(client)
    asked = path.format(project_id=project_id)
    for response in (await client.get(asked), await client.delete(asked)):
        assert asked.rpartition("/")[2] not in service_error(response, 404)  # not quoted: it could be a key


async def test_the_audit_log_of_a_project_id_that_could_not_exist_is_empty(client: httpx.AsyncClient) -> None:
    await project_with_integration(client)
    response = await client.get("/api/v1/audit", params={"project_id": "prj_\x00"})
    assert response.json() == {"items": []}


async def test_the_stream_idle_timeout_defaults_to_300_and_round_trips(client: httpx.AsyncClient) -> None:
    project_id = await project_with_integration(client)
    url = f"/api/v1/projects/{project_id}/integrations/acme"
    assert (await client.get(url)).json()["stream_idle_timeout_seconds"] == 300
    changed = await client.patch(url, json={"stream_idle_timeout_seconds": 0.25})
    assert changed.json()["stream_idle_timeout_seconds"] == 0.25
    assert (await client.get(url)).json()["stream_idle_timeout_seconds"] == 0.25
    assert (await client.get(url)).json()["timeout_seconds"] == 600  # the other timeout is its own setting


async def test_an_admin_token_with_the_longest_name_can_still_change_things(
    client: httpx.AsyncClient, ctx: Context
) -> None:
    """The audit log's actor ("admin-token:" and the name) is longer than a name may be: it is cut, not a 500."""
    token = await admins.create_admin_token(ctx, name="n" * MAX_NAME_LENGTH, actor="tests")
    response = await client.post("/api/v1/projects", json={"name": "p"}, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 201
    actors = [event["actor"] for event in (await client.get("/api/v1/audit")).json()["items"]]
    assert actors[0] == ("admin-token:" + "n" * MAX_NAME_LENGTH)[:MAX_ACTOR_LENGTH]
