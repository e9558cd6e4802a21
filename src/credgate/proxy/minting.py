"""`POST /api/v1/client-tokens`: a project's backend, with its project token, mints a short-lived, scoped client
token for a page or an app (client_tokens.py). Raw ASGI beside the proxy, since a page load may mint: one cached
token lookup, one HMAC, no write.
"""

import json
import time
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from starlette.types import Receive, Scope, Send

from credgate import client_tokens, metrics
from credgate.client_tokens import CLIENT_TOKEN_PREFIX, DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS, ClientGrant
from credgate.error_responses import validation_message
from credgate.errors import (
    BadRequest,
    Forbidden,
    InvalidInput,
    MethodNotAllowed,
    PayloadTooLarge,
    ServiceError,
    Unauthorized,
    Unavailable,
)
from credgate.limits import MAX_ENDPOINTS, MAX_SUBJECT_LENGTH, Name, check_subject
from credgate.proxy.client import CHALLENGE, send_error
from credgate.proxy.plan import IDENTITY_TOKEN_PREFIX, find_token
from credgate.services.access import Access, resolve_access
from credgate.services.context import Context
from credgate.specs import Endpoint, Origins, ProviderName
from credgate.storage import StorageUnavailable

PATH = b"/api/v1/client-tokens"
_MAX_BODY_BYTES = 64 * 1024
_MAX_PROVIDERS = 64
_JSON_HEADERS = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]


class MintRequest(BaseModel):
    """What a client token may do; each scope within the project's (none named: all of the project's)."""

    model_config = ConfigDict(extra="forbid")

    ttl_seconds: Annotated[int, Field(ge=1, le=MAX_TTL_SECONDS, strict=True)] = DEFAULT_TTL_SECONDS
    subject: Annotated[Name, Field(max_length=MAX_SUBJECT_LENGTH), AfterValidator(check_subject)] | None = None
    providers: Annotated[list[ProviderName], Field(max_length=_MAX_PROVIDERS)] | None = None
    endpoints: Annotated[list[Endpoint], Field(max_length=MAX_ENDPOINTS)] | None = None
    origins: Origins | None = None


class MintedToken(BaseModel):
    """The answer to a mint (201): the token, and when it stops being accepted."""

    model_config = ConfigDict(extra="forbid")

    token: Annotated[str, Field(description="the client token, `cgc_…`: give it to the page or app")]
    expires_at: Annotated[datetime, Field(description="its end, in UTC, to the millisecond")]


class ClientTokenMinter:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            status, body = await self._mint(scope, receive)
        except ServiceError as error:
            await send_error(send, error)
            return
        await send({"type": "http.response.start", "status": status, "headers": _JSON_HEADERS})
        await send({"type": "http.response.body", "body": body})

    async def _mint(self, scope: Scope, receive: Receive) -> tuple[int, bytes]:
        if scope["method"] != "POST":
            raise MethodNotAllowed("client tokens are minted with POST", headers={"Allow": "POST"})
        token = find_token(scope["headers"])
        if token is None:
            raise Unauthorized("a project token is required", headers=dict(CHALLENGE))
        if token.startswith((CLIENT_TOKEN_PREFIX, IDENTITY_TOKEN_PREFIX)):
            # A client token, or an end user's, never mints: a leaked one stays as narrow and short as it was.
            raise Forbidden("only a project token can mint client tokens")
        access = await self._access(token, "")
        request = _parse(await _read_body(receive))
        now = time.time()
        # To the millisecond: whole seconds would cut up to one off a token's life (a 1 s token born dead).
        expires_at = round(now + request.ttl_seconds, 3)
        if access.token_expires_at is not None:  # never outlives the token that minted it
            expires_at = min(expires_at, access.token_expires_at.timestamp())
        for index, provider in enumerate(request.providers or ()):
            if (await self._access(token, provider)).integration is None:
                raise InvalidInput(f"providers.{index}", f"this project has no integration {provider}")
        for index, origin in enumerate(request.origins or ()):
            if origin not in access.allowed_origins:
                raise InvalidInput(f"origins.{index}", "is not one of the project's allowed origins")
        grant = ClientGrant(
            project_id=access.project_id,
            minted_by=access.token_hash,
            expires_at=expires_at,
            subject=request.subject,
            providers=None if request.providers is None else frozenset(request.providers),
            endpoints=None if request.endpoints is None else tuple(request.endpoints),
            origins=None if request.origins is None else frozenset(request.origins),
        )
        try:
            minted = client_tokens.mint(self.ctx.keyring, grant)
        except client_tokens.TooLarge as error:
            raise InvalidInput("endpoints", str(error)) from None
        metrics.client_tokens_minted.labels(access.project_id).inc()
        answer = {"token": minted, "expires_at": datetime.fromtimestamp(expires_at, UTC).isoformat()}
        return 201, json.dumps(answer).encode()

    async def _access(self, token: str, provider: str) -> Access:
        try:
            access = await resolve_access(self.ctx, token=token, provider=provider)
        except StorageUnavailable:
            raise Unavailable("storage unavailable") from None
        if access is None:
            raise Unauthorized("invalid project token", headers=dict(CHALLENGE))
        return access


async def _read_body(receive: Receive) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest("the request body was not sent")
        body += message.get("body", b"")
        if len(body) > _MAX_BODY_BYTES:
            raise PayloadTooLarge(f"request body over the limit of {_MAX_BODY_BYTES} bytes")
        if not message.get("more_body", False):
            return bytes(body)


class _Unprocessable(ServiceError):
    status = 422  # the admin API's answer to a body it cannot take, with the same words


def _parse(body: bytes) -> MintRequest:
    try:
        return MintRequest.model_validate_json(body or b"{}")
    except ValidationError as error:
        raise _Unprocessable(validation_message(error.errors(include_input=False))) from None
