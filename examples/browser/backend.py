"""The example's backend: it serves the page and gives each visitor a client token. The project token comes from
the environment and never leaves this process; the page only ever holds a short-lived, scoped client token.

    CREDGATE_URL=http://127.0.0.1:8080 CREDGATE_PROJECT_TOKEN=cgp_… python backend.py --port 8000

Python's standard library only. CREDGATE_PUBLIC_URL (default: CREDGATE_URL) is the gateway's address as browsers
reach it, should this backend reach it by another (inside a private network, say).
"""

import argparse
import contextlib
import json
import os
import sys
import urllib.error
import urllib.request
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/app.js": ("app.js", "text/javascript; charset=utf-8")}
# A real app takes the user from its own session (its sign-in cookie), never from the request: the subject is
# whom credgate's request log, per-user rate limit and per-user budgets count. This example has no sign-in.
DEMO_USER = "demo-user"


def mint_client_token(credgate_url: str, project_token: str, *, user_id: str, origin: str) -> dict[str, Any]:
    """A client token for one user: 15 minutes, OpenAI chat completions only, from this page's origin only."""
    scope = {
        "subject": user_id,
        "ttl_seconds": 900,
        "providers": ["openai"],
        "endpoints": [{"method": "POST", "path": "chat/completions"}],
        "origins": [origin],
    }
    request = urllib.request.Request(  # noqa: S310 - CREDGATE_URL, checked to be http(s) at start
        f"{credgate_url}/api/v1/client-tokens",
        data=json.dumps(scope).encode(),
        headers={"Authorization": f"Bearer {project_token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - as above
        minted: dict[str, Any] = json.load(response)
    return minted  # {"token": "cgc_…", "expires_at": "…"}


class Handler(BaseHTTPRequestHandler):
    credgate_url = ""
    public_url = ""
    project_token = ""

    def do_GET(self) -> None:
        if self.path == "/client-token":
            self.send_client_token()
        elif self.path in FILES:
            name, content_type = FILES[self.path]
            self.answer(HTTPStatus.OK, (HERE / name).read_bytes(), content_type)
        else:
            self.answer_error(HTTPStatus.NOT_FOUND, "not found")

    def send_client_token(self) -> None:
        # The origin the page was loaded from (http here; https behind TLS). credgate mints only for an origin
        # the project lists, and the proxy answers only pages of that origin.
        origin = f"http://{self.headers.get('Host', '')}"
        try:
            minted = mint_client_token(self.credgate_url, self.project_token, user_id=DEMO_USER, origin=origin)
        except urllib.error.HTTPError as refused:
            message = f"credgate refused a client token ({refused.code}): {_error_message(refused)}"
            self.answer_error(HTTPStatus.BAD_GATEWAY, message)
            return
        except (OSError, ValueError) as failed:  # URLError is an OSError
            self.answer_error(HTTPStatus.BAD_GATEWAY, f"credgate could not be reached: {failed}")
            return
        # The gateway's address goes with the token, so the page has no configuration of its own.
        answer = {**minted, "subject": DEMO_USER, "gateway": self.public_url}
        self.answer(HTTPStatus.OK, json.dumps(answer).encode(), "application/json")

    def answer_error(self, status: HTTPStatus, message: str) -> None:
        self.answer(status, json.dumps({"error": {"message": message}}).encode(), "application/json")

    def answer(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)


def _error_message(refused: urllib.error.HTTPError) -> str:
    """credgate's service error is `{"error": {"status", "message"}}`."""
    try:
        return str(json.load(refused)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return str(refused.reason)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--host", default="127.0.0.1")
    options = parser.parse_args()
    for name in ("CREDGATE_URL", "CREDGATE_PROJECT_TOKEN"):
        if not os.environ.get(name):
            parser.error(f"set {name}")
    Handler.credgate_url = os.environ["CREDGATE_URL"].rstrip("/")
    Handler.public_url = os.environ.get("CREDGATE_PUBLIC_URL", Handler.credgate_url).rstrip("/")
    Handler.project_token = os.environ["CREDGATE_PROJECT_TOKEN"]
    if not Handler.credgate_url.startswith(("http://", "https://")):
        parser.error("CREDGATE_URL must be an http:// or https:// URL")
    with ThreadingHTTPServer((options.host, options.port), Handler) as server:
        sys.stderr.write(f"the example is at http://{options.host}:{options.port}\n")
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop without a traceback
            server.serve_forever()


if __name__ == "__main__":
    main()
