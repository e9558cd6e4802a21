"""The one service-error shape on the wire (README, Errors), and its handlers for the control app.

`{"error": {"status", "message"}}`, the same status on the response, `X-Credgate-Error: true`. Upstream
responses never pass through here.
"""

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from credgate.errors import ServiceError, internal_error
from credgate.storage import StorageUnavailable

if TYPE_CHECKING:  # FastAPI is loaded with the control app, which the proxy and the CLI's commands do without
    from fastapi import FastAPI

logger = logging.getLogger(__name__)
ERROR_HEADER = "x-credgate-error"
# Our field and parameter names are short lowercase snake case; no provider key has that shape.
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,31}")
_REASONS = {400: "bad request", 401: "unauthorized", 404: "not found", 405: "method not allowed"}


class ErrorDetailOut(BaseModel):
    status: int
    message: str


class ErrorOut(BaseModel):
    """The service-error envelope, as the OpenAPI document shows it."""

    error: ErrorDetailOut


# The service errors an admin API operation may answer, for its OpenAPI document (in place of FastAPI's own 422).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut, "description": description}
    for status, description in (
        (400, "malformed request"),
        (401, "missing or invalid admin token"),
        (404, "unknown resource"),
        (409, "conflict with the current state"),
        (422, "invalid input; the message names the field"),
        (503, "storage unavailable"),
    )
}


def error_body(status: int, message: str) -> bytes:
    return json.dumps({"error": {"status": status, "message": message}}).encode()


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        error_body(status, message),
        status_code=status,
        media_type="application/json",
        headers={ERROR_HEADER: "true", **(headers or {})},
    )


def service_error_response(error: ServiceError) -> Response:
    return error_response(error.status, error.message, error.headers)


def validation_message(errors: Sequence[Mapping[str, Any]]) -> str:
    """Name each field and its problem, never a submitted value. A location part that does not look like one
    of our names (a map's key, say, which could be a key pasted in the wrong place) is shown as `*`."""
    problems = []
    for error in errors:
        location = list(error.get("loc", ()))
        if location and location[0] in ("body", "query", "path", "header"):
            location = location[1:]  # where FastAPI found it, not a field
        location = [str(part) if isinstance(part, int) or _NAME.fullmatch(str(part)) else "*" for part in location]
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        problems.append(f"{'.'.join(location)}: {message}" if location else message)
    return "; ".join(problems)


def request_id_of(request: Request) -> str:
    return str(request.scope.get("state", {}).get("request_id", "unknown"))


def install_error_handlers(app: "FastAPI") -> None:
    from fastapi.exceptions import RequestValidationError

    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, error: ServiceError) -> Response:
        return service_error_response(error)

    @app.exception_handler(RequestValidationError)
    async def _invalid_input(_request: Request, error: RequestValidationError) -> Response:
        return error_response(422, validation_message(list(error.errors())))

    @app.exception_handler(StorageUnavailable)
    async def _storage_unavailable(request: Request, _error: StorageUnavailable) -> Response:
        logger.warning("storage unavailable for request %s", request_id_of(request))
        return error_response(503, f"storage unavailable (request id {request_id_of(request)})")

    @app.exception_handler(HTTPException)
    async def _http_error(_request: Request, error: HTTPException) -> Response:
        return error_response(error.status_code, _REASONS.get(error.status_code, "error"), error.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, _error: Exception) -> Response:
        request_id = request_id_of(request)
        logger.exception("unexpected error in request %s", request_id)
        return service_error_response(internal_error(request_id))
