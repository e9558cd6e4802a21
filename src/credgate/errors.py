"""The service-error hierarchy: every error of credgate itself, with its status and public message.

    ServiceError (500)
    ├── BadRequest (400)
    ├── Unauthorized (401)
    ├── Forbidden (403)
    ├── NotFound (404)
    ├── MethodNotAllowed (405)
    ├── RequestTimeout (408)
    ├── Conflict (409)
    ├── PayloadTooLarge (413)
    ├── InvalidInput (422)
    ├── PaymentRequired (402)
    ├── RateLimited (429)
    ├── BadGateway (502)
    ├── Unavailable (503)
    └── GatewayTimeout (504)

The message is public: it reaches the caller, so it never holds a secret or an internal detail.
"""

from typing import ClassVar


class ServiceError(Exception):
    """An error of credgate itself, answered in credgate's error envelope (README, Errors)."""

    status: ClassVar[int] = 500
    default_message: ClassVar[str] = "internal error"

    def __init__(self, message: str | None = None, *, headers: dict[str, str] | None = None) -> None:
        self.message = message or self.default_message
        self.headers = headers or {}
        super().__init__(self.message)


def internal_error(request_id: str) -> ServiceError:
    """A failure of credgate's own, answered with nothing internal: the request id, to find its traceback in the log."""
    return ServiceError(f"internal error (request id {request_id})")


class BadRequest(ServiceError):
    """The request is malformed (a bad provider name or endpoint)."""

    status = 400
    default_message = "bad request"


class Unauthorized(ServiceError):
    """The caller's token is missing, malformed, unknown, expired or revoked."""

    status = 401
    default_message = "invalid token"


class Forbidden(ServiceError):
    """The caller is known but may not do this."""

    status = 403
    default_message = "forbidden"


class NotFound(ServiceError):
    """The named resource does not exist (or is not the caller's)."""

    status = 404
    default_message = "not found"


class MethodNotAllowed(ServiceError):
    """A method the proxy never forwards (TRACE, CONNECT, WebDAV verbs); `Allow` lists those it does."""

    status = 405
    default_message = "method not allowed"


class RequestTimeout(ServiceError):
    """The client did not send its request in time."""

    status = 408
    default_message = "request timeout"


class Conflict(ServiceError):
    """The change conflicts with the current state."""

    status = 409
    default_message = "conflict"


class PayloadTooLarge(ServiceError):
    """The request body is over the configured limit."""

    status = 413
    default_message = "request body too large"


class InvalidInput(ServiceError):
    """The input is invalid; the message names the field, never its value."""

    status = 422
    default_message = "invalid input"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class PaymentRequired(ServiceError):
    """A budget of the project is spent for its current period."""

    status = 402


class RateLimited(ServiceError):
    """The project's rate limit is exceeded."""

    status = 429
    default_message = "rate limit exceeded"


class BadGateway(ServiceError):
    """The upstream could not be reached or broke the exchange."""

    status = 502
    default_message = "upstream unreachable"


class Unavailable(ServiceError):
    """The gateway is overloaded or its storage does not answer."""

    status = 503
    default_message = "service unavailable"


class GatewayTimeout(ServiceError):
    """The upstream did not answer in time."""

    status = 504
    default_message = "upstream timed out"


class StartupError(Exception):
    """The gateway cannot start as configured; the message tells the operator what to fix."""
