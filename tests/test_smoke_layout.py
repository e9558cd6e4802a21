"""A first check that the fixtures give a working admin API on each backend."""

import httpx


async def test_project_round_trip(client: httpx.AsyncClient) -> None:
    created = await client.post("/api/v1/projects", json={"name": "demo"})
    assert created.status_code == 201
    project_id = created.json()["project"]["id"]
    fetched = await client.get(f"/api/v1/projects/{project_id}")
    assert fetched.json()["name"] == "demo"
