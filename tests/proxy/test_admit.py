"""plan.admit: the contract's checks after the token, in its order, without sockets."""

import dataclasses

import pytest

from credgate.crypto import Secret
from credgate.errors import BadRequest, Forbidden, NotFound, PayloadTooLarge, ServiceError
from credgate.proxy.plan import Admitted, admit
from credgate.specs import Endpoint
from tests.proxy.test_plan import resolved

CHAT = Endpoint(method="POST", path="chat/completions")
LIMIT = 1000
INTEGRATION = dataclasses.replace(resolved(), endpoints=(CHAT,))


def admitted(
    *,
    method: str = "POST",
    provider: str = "openai",
    endpoint: str = "chat/completions",
    length: int | None = 10,
    **changes: object,
) -> Admitted:
    integration = dataclasses.replace(INTEGRATION, **changes) if changes else INTEGRATION  # type: ignore[arg-type]
    headers = [(b"content-length", str(length).encode())] if length is not None else []
    return admit(
        method=method,
        provider=provider,
        raw_endpoint=endpoint,
        headers=headers,
        integration=integration,
        max_request_bytes=LIMIT,
    )


def test_an_enabled_endpoint_is_admitted_with_its_credential_and_length() -> None:
    result = admitted()
    assert result.integration is INTEGRATION
    assert result.credential.reveal() == "sk-provider-key-1234"
    assert result.declared_length == 10
    assert admitted(length=None).declared_length is None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"provider": "Bad Name"}, BadRequest, "malformed provider name"),
        ({"endpoint": "a/../b"}, BadRequest, "malformed endpoint"),
        ({"endpoint": ""}, BadRequest, "empty endpoint"),
        ({"enabled": False}, Forbidden, "integration openai is disabled"),
        ({"credential": None}, Forbidden, "key of openai is revoked"),
        ({"method": "GET"}, Forbidden, "GET chat/completions is not an enabled endpoint of openai"),
        ({"method": "HEAD"}, Forbidden, "not an enabled endpoint"),
        ({"endpoint": "embeddings"}, Forbidden, "not an enabled endpoint"),
        ({"length": LIMIT + 1}, PayloadTooLarge, f"over the limit of {LIMIT} bytes"),
    ],
)
def test_each_refusal_names_its_reason(kwargs: dict[str, object], error: type[ServiceError], message: str) -> None:
    with pytest.raises(error, match=message):
        admitted(**kwargs)  # type: ignore[arg-type]


def test_no_integration_is_404_before_anything_about_the_endpoint() -> None:
    with pytest.raises(NotFound, match="no integration openai"):
        admit(method="GET", provider="openai", raw_endpoint="x", headers=[], integration=None, max_request_bytes=LIMIT)


def test_the_contracts_order_400_then_404_then_403_then_413() -> None:
    # A bad target is 400 even without an integration; a revoked key is 403 even over the size limit.
    with pytest.raises(BadRequest):
        admit(method="POST", provider="x", raw_endpoint="..", headers=[], integration=None, max_request_bytes=1)
    with pytest.raises(Forbidden):
        admitted(credential=None, length=LIMIT * 10)
    with pytest.raises(Forbidden):
        admitted(method="DELETE", length=LIMIT * 10)


def test_a_malformed_length_is_left_to_the_body_limit() -> None:
    result = admit(
        method="POST",
        provider="openai",
        raw_endpoint="chat/completions",
        headers=[(b"content-length", b"ten")],
        integration=dataclasses.replace(INTEGRATION, credential=Secret("k")),
        max_request_bytes=LIMIT,
    )
    assert result.declared_length is None
