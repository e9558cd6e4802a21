"""OpenAI-style chat completions, as the OpenAI-compatible providers' stand-ins answer them: the documented shape
of a completion and of its streamed chunks, a handler answering both, and the check that the bearer key arrived
(once) while the project token did not."""

import json
from collections.abc import Mapping

from aiohttp import web

from tests.e2e.conftest import Project
from tests.sdk.standin import Handler, StandIn, assert_token_nowhere

ANSWER = "Hello!"
STREAMED = ("Hel", "lo", "!")  # the answer's streamed pieces, in order
USAGE = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


def completion(
    model: str, content: str, *, chunk: bool = False, finish_reason: str | None = "stop"
) -> dict[str, object]:
    """A chat completion, or one streamed chunk of it (`delta` instead of `message`, no usage)."""
    choice: dict[str, object] = {
        "index": 0,
        "delta" if chunk else "message": {"role": "assistant", "content": content},
        "finish_reason": finish_reason,
    }
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk" if chunk else "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [choice],
        **({} if chunk else {"usage": USAGE}),
    }


def chat_handler(extra: Mapping[str, object] | None = None) -> Handler:
    """A chat completions handler: the whole answer, or with `"stream": true` Server-Sent Events of its pieces
    ending in `[DONE]`; `extra` adds a provider's own top-level fields to the completion and to every chunk."""
    fields = dict(extra or {})

    async def chat(request: web.Request, body: bytes) -> web.StreamResponse:
        sent = json.loads(body)
        if not sent.get("stream"):
            return web.json_response(completion(sent["model"], ANSWER) | fields)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index, piece in enumerate(STREAMED):
            last = index == len(STREAMED) - 1
            chunk = completion(sent["model"], piece, chunk=True, finish_reason="stop" if last else None) | fields
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return chat


chat = chat_handler()


def assert_bearer_key(stand_in: StandIn, project: Project, key: str) -> None:
    """Every request the provider received carried the key as its one bearer token, and no project token."""
    assert stand_in.received
    for received in stand_in.received:
        assert [value for name, value in received.headers if name.lower() == "authorization"] == [f"Bearer {key}"]
    assert_token_nowhere(stand_in, project)
