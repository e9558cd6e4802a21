"""`CREDGATE_LOG_FORMAT=json`: every log line of a real `credgate serve` is one JSON object, the access line has the
request's fields, and a line written while serving a request names it."""

import json
import re
from pathlib import Path

import httpx

from tests.e2e.conftest import start_gateway, stop_gateway
from tests.e2e.test_workers import add_project
from tests.upstream import Upstream

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[\d+\] ")


async def test_json_logs_are_one_object_a_line_with_the_access_fields_and_the_request_id(
    tmp_path: Path, upstream: Upstream
) -> None:
    process, gateway = start_gateway(tmp_path / "data", tmp_path / "gateway.log", {"CREDGATE_LOG_FORMAT": "json"})
    try:
        project, admin_token = await add_project(tmp_path / "data", upstream)
        async with httpx.AsyncClient(base_url=gateway.url) as client:
            proxied = await client.get(
                "/proxy/stand-in/echo/hello?api_key=query-value-never-logged",
                headers={"authorization": f"Bearer {project.token}"},
            )
            refused = await client.get("/proxy/stand-in/echo/hello", headers={"authorization": "Bearer cgp_wrong"})
            listed = await client.get("/api/v1/projects", headers={"authorization": f"Bearer {admin_token}"})
    finally:
        stop_gateway(process, gateway)
    assert (proxied.status_code, refused.status_code, listed.status_code) == (200, 401, 200)

    text = gateway.log.read_text()
    assert not [line for line in text.splitlines() if TEXT_LINE.match(line)]  # no line in the text format
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert {"time", "level", "logger", "pid", "message"} <= set(lines[0])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", lines[0]["time"])
    assert any(line["message"] == "Application startup complete." for line in lines)
    # At DEBUG (the tests' gateways): debug lines, but not the SQLite driver's two a database call.
    assert any(line["level"] == "debug" for line in lines)
    assert not [line for line in lines if line["logger"] == "aiosqlite"]
    access = {line["request_id"]: line for line in lines if line["logger"] == "credgate.access"}

    served = access[proxied.headers["x-credgate-request-id"]]
    assert served["http"] == {
        "method": "GET",
        "path": "/proxy/stand-in/echo/hello",
        "status": 200,
        "duration_ms": served["http"]["duration_ms"],
        "project": project.id,
        "provider": "stand-in",
        "request_bytes": 0,
        "response_bytes": len(proxied.content),
    }
    assert served["http"]["duration_ms"] > 0
    assert access[refused.headers["x-credgate-request-id"]]["http"]["status"] == 401
    admin = access[listed.headers["x-credgate-request-id"]]["http"]
    assert (admin["path"], admin["status"], "project" in admin) == ("/api/v1/projects", 200, False)
    assert "query-value-never-logged" not in text
    assert project.token not in text
    assert admin_token not in text
