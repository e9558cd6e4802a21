"""Admin API: the audit log's export, JSON Lines of its hash chain (README, Audit log)."""

import json

import httpx

from credgate.audit_chain import GENESIS, verify_lines


async def test_the_export_is_the_whole_chain_and_it_verifies(client: httpx.AsyncClient) -> None:
    for name in ("a", "b", "c"):
        assert (await client.post("/api/v1/projects", json={"name": name})).status_code == 201
    response = await client.get("/api/v1/audit/export")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    lines = response.text.splitlines(keepends=True)
    entries = [json.loads(line) for line in lines]
    assert [entry["action"] for entry in entries] == ["admin_token.create", *["project.create"] * 3]
    assert entries[0]["previous_hash"] == GENESIS
    assert verify_lines(lines).head == entries[-1]["hash"]
    listed = (await client.get("/api/v1/audit", params={"limit": 1})).json()["items"][0]
    assert {key: entries[-1][key] for key in ("actor", "action", "project_id")} == {
        key: listed[key] for key in ("actor", "action", "project_id")
    }


async def test_the_export_needs_an_admin_token(anonymous: httpx.AsyncClient) -> None:
    response = await anonymous.get("/api/v1/audit/export")
    assert response.status_code == 401
    assert response.headers["content-type"].startswith("application/json")
