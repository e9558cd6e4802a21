"""A real `credgate serve` whose SQLite files are deleted under it: 503s, nothing accepted, the CLI refuses."""

from pathlib import Path

import httpx

from tests.e2e.conftest import RunningGateway


def test_a_gateway_whose_database_is_deleted_answers_503_and_the_next_start_refuses(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    created = gateway.cli("admin", "create-token", "--name", "e2e")  # the CLI writes to the server's database
    assert created.returncode == 0, created.stderr
    admin = {"Authorization": f"Bearer {created.stdout.strip()}"}
    projects = f"{gateway.url}/api/v1/projects"
    assert httpx.post(projects, json={"name": "kept"}, headers=admin).status_code == 201
    database = tmp_path / "data" / "credgate.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{database}{suffix}").unlink(missing_ok=True)

    assert httpx.get(f"{gateway.url}/readyz").status_code == 503
    lost = httpx.post(projects, json={"name": "lost"}, headers=admin)
    assert lost.status_code == 503
    assert lost.json()["error"]["message"] == f"storage unavailable (request id {lost.headers['x-request-id']})"
    assert "credgate.db was deleted or replaced" in gateway.log.read_text()

    refused = gateway.cli("projects", "list")
    assert refused.returncode == 5
    assert "the database is missing: the database file" in refused.stderr
    assert not database.exists()
