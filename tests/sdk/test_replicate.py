"""The official `replicate` SDK through the gateway: a bearer key, predictions created, read and waited for."""

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web
from replicate.client import Client

from credgate.services import integrations
from credgate.services.context import Context
from tests.e2e.conftest import Project
from tests.sdk.standin import StandIn, assert_token_nowhere, connect_template, run_stand_in

MODEL = "replicate/hello-world"
VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
PREDICTION = "gm3qorzdhgbfurvjtvhg6dckhu"
INPUT = {"text": "Alice"}


def prediction(status: str) -> dict[str, object]:
    """A prediction as the API documents it."""
    done = status == "succeeded"
    api = f"https://api.replicate.com/v1/predictions/{PREDICTION}"
    return {
        "id": PREDICTION,
        "model": MODEL,
        "version": VERSION,
        "input": INPUT,
        "logs": "",
        "output": "hello Alice" if done else None,
        "data_removed": False,
        "error": None,
        "status": status,
        "created_at": "2025-01-01T00:00:00.000000Z",
        "started_at": "2025-01-01T00:00:00.500000Z" if done else None,
        "completed_at": "2025-01-01T00:00:01.000000Z" if done else None,
        "metrics": {"predict_time": 0.5} if done else {},
        "urls": {"get": api, "cancel": f"{api}/cancel"},
    }


async def create(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.json_response(prediction("starting"), status=201)


async def read(request: web.Request, body: bytes) -> web.StreamResponse:
    return web.json_response(prediction("succeeded"))


async def version(request: web.Request, body: bytes) -> web.StreamResponse:
    schema = {"openapi": "3.0.2", "components": {"schemas": {"Output": {"type": "string"}}}}
    return web.json_response(
        {"id": VERSION, "created_at": "2024-01-01T00:00:00Z", "cog_version": "0.9.4", "openapi_schema": schema}
    )


ROUTES = {
    ("POST", "/v1/predictions"): create,
    ("POST", "/v1/models/{owner}/{name}/predictions"): create,
    ("GET", f"/v1/predictions/{PREDICTION}"): read,
    ("GET", f"/v1/models/{MODEL}/versions/{VERSION}"): version,
}


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with run_stand_in(ROUTES) as running:
        yield running


@pytest.fixture
async def key(ctx: Context, project: Project, stand_in: StandIn) -> str:
    key = await connect_template(ctx, project, stand_in, template="replicate-predictions")
    await integrations.add_template_integration(
        ctx, project_id=project.id, provider="replicate", template_id="replicate-models", actor="tests"
    )
    return key


@pytest.fixture
async def client(gateway_url: str, project: Project, key: str) -> AsyncIterator[Client]:
    # The SDK never closes its connections; a transport of the test's own is closed at the end.
    async with httpx.AsyncHTTPTransport() as transport:
        client = Client(api_token=project.token, base_url=f"{gateway_url}/proxy/replicate", transport=transport)
        client.poll_interval = 0.01
        yield client


def calls(stand_in: StandIn) -> list[str]:
    return [f"{received.method} {received.path_qs}" for received in stand_in.received]


def assert_key_placed(stand_in: StandIn, project: Project, key: str) -> None:
    for received in stand_in.received:
        assert [value for name, value in received.headers if name.lower() == "authorization"] == [f"Bearer {key}"]
    assert_token_nowhere(stand_in, project)


async def test_a_prediction_is_created_and_read(client: Client, stand_in: StandIn, project: Project, key: str) -> None:
    created = await client.models.predictions.async_create(model=MODEL, input=INPUT)
    read = await client.predictions.async_get(created.id)
    assert (created.status, read.status, read.output) == ("starting", "succeeded", "hello Alice")
    assert calls(stand_in) == [f"POST /v1/models/{MODEL}/predictions", f"GET /v1/predictions/{PREDICTION}"]
    assert json.loads(stand_in.received[0].body) == {"input": INPUT}
    assert_key_placed(stand_in, project, key)


async def test_run_waits_for_the_prediction_then_polls_it_to_its_output(
    client: Client, stand_in: StandIn, project: Project, key: str
) -> None:
    output = await client.async_run(f"{MODEL}:{VERSION}", input=INPUT, use_file_output=False)
    assert output == "hello Alice"
    assert calls(stand_in) == [
        "POST /v1/predictions",
        f"GET /v1/models/{MODEL}/versions/{VERSION}",
        f"GET /v1/predictions/{PREDICTION}",
    ]
    create = stand_in.received[0]
    assert [value for name, value in create.headers if name.lower() == "prefer"] == ["wait"]
    assert json.loads(create.body) == {"version": VERSION, "input": INPUT}
    assert_key_placed(stand_in, project, key)
