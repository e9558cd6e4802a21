"""The shape a stored key must have for methods that need more than an opaque string; errors never echo it."""

import json

import pytest

from credgate.key_shapes import aws_key_parts, check_key_shape, service_account_info
from credgate.services.provider_keys import key_hint
from credgate.specs import AwsSigV4Auth, BasicAuth, BearerAuth, GoogleServiceAccountAuth, HeaderAuth

PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC-shape-test-body\n-----END PRIVATE KEY-----\n"
SERVICE_ACCOUNT = {"client_email": "a@p.iam.gserviceaccount.com", "private_key": PEM, "private_key_id": "k1"}


def test_a_service_account_key_file_is_parsed_whole() -> None:
    key_file = json.dumps(SERVICE_ACCOUNT | {"type": "service_account", "project_id": "p"}, indent=2)
    assert service_account_info(key_file)["private_key_id"] == "k1"
    check_key_shape(GoogleServiceAccountAuth(method="google_service_account"), key_file)


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("AIzaSy-an-api-key-pasted-instead-0001", "not valid JSON"),
        (json.dumps([SERVICE_ACCOUNT]), "a JSON object"),
        (json.dumps(SERVICE_ACCOUNT | {"client_email": None}), "client_email is missing"),
        (json.dumps({k: v for k, v in SERVICE_ACCOUNT.items() if k != "private_key_id"}), "private_key_id is missing"),
        (json.dumps(SERVICE_ACCOUNT | {"private_key": "MIIEvQIBADAN-no-pem-markers-0001"}), "not a PEM private key"),
        (json.dumps(SERVICE_ACCOUNT | {"private_key": PEM.replace("PRIVATE", "PUBLIC")}), "not a PEM private key"),
    ],
)
def test_a_key_that_is_no_service_account_key_file_is_refused_without_echo(key: str, reason: str) -> None:
    with pytest.raises(ValueError, match="JSON key file") as raised:
        check_key_shape(GoogleServiceAccountAuth(method="google_service_account"), key)
    message = str(raised.value)
    assert reason in message
    assert not any(part in message for part in ("shape-test-body", "AIzaSy", "no-pem-markers"))


EXAMPLE_ID, EXAMPLE_SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize(
    ("key", "parts"),
    [
        (f"{EXAMPLE_ID}:{EXAMPLE_SECRET}", (EXAMPLE_ID, EXAMPLE_SECRET, None)),
        ("ASIAEXAMPLE:secret+/=:FwoGZXIvYXdz//token=", ("ASIAEXAMPLE", "secret+/=", "FwoGZXIvYXdz//token=")),
    ],
)
def test_aws_keys_split_into_their_parts(key: str, parts: tuple[str, str, str | None]) -> None:
    assert aws_key_parts(key) == parts
    check_key_shape(AwsSigV4Auth(method="aws_sigv4", region="us-east-1"), key)


@pytest.mark.parametrize(
    "key",
    [
        "AKIAONLYANIDSECRETLESS",
        "AKIAEXAMPLE:",
        ":secretwithoutid",
        "AKIAEXAMPLE::token",
        "AKIAEXAMPLE:secret:token:extra",
        "AKIAEXAMPLE:sec ret",
        "AKIAEXAMPLE:secret\t",
    ],
)
def test_an_aws_key_of_another_shape_is_refused_without_echo(key: str) -> None:
    with pytest.raises(ValueError, match="ACCESS_KEY_ID:SECRET_ACCESS_KEY") as raised:
        check_key_shape(AwsSigV4Auth(method="aws_sigv4", region="us-east-1"), key)
    assert not any(part in str(raised.value) for part in ("AKIA", "secret", "token", "extra"))


@pytest.mark.parametrize(
    "auth", [BearerAuth(), HeaderAuth(method="header", name="x-api-key"), BasicAuth(method="basic")]
)
def test_opaque_keys_take_any_shape(auth: BearerAuth | HeaderAuth | BasicAuth) -> None:
    check_key_shape(auth, "{not json: and no colon-split rule")


def test_the_hint_of_a_key_with_parts_is_the_end_of_its_public_id() -> None:
    key_file = json.dumps(SERVICE_ACCOUNT | {"private_key_id": "0123456789abcdef"}, indent=2)
    assert key_hint(key_file, auth_method="google_service_account") == "…cdef"
    assert key_hint(f"{EXAMPLE_ID}:{EXAMPLE_SECRET}:token", auth_method="aws_sigv4") == "…MPLE"
    assert key_hint("not-a-key-file-at-all", auth_method="google_service_account") is None
    assert key_hint("sk-plain-opaque-key-wxyz", auth_method="bearer") == "…wxyz"
