"""The proxy over real sockets: the credential injected, the response relayed byte for byte."""

import httpx

from tests.e2e.conftest import Project
from tests.upstream import Upstream


async def test_chat_completion_reaches_upstream_with_the_key_not_the_token(
    gateway_url: str, upstream: Upstream, project: Project
) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{gateway_url}/proxy/openai/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {project.token}"},
        )
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Hello!"
    assert upstream.last.header("authorization") == f"Bearer {project.key}"
    assert project.token not in str(upstream.last.headers)
    assert response.headers["x-request-id"]
