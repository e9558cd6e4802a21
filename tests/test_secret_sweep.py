"""The sweep itself must catch a leak, or its silence would prove nothing."""

import base64
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.secret_sweep import SecretSweep, exposed

KEY = "sk-test-sweepsweepsweep1234"


def test_sweep_finds_a_key_from_a_request_in_a_response() -> None:
    sweep = SecretSweep()
    sweep.register_request_body(b'{"provider": "x", "nested": [{"api_key": "%s"}]}' % KEY.encode())
    sweep.capture("response", f'{{"echo": "{KEY}"}}')
    assert sweep.findings() == ["response: sk-tes…"]


def test_sweep_finds_a_key_in_a_file(tmp_path: Path) -> None:
    sweep = SecretSweep()
    (tmp_path / "db").write_bytes(b"\x00" + KEY.encode() + b"\x00")
    sweep.scan_file(tmp_path / "db", [KEY])
    assert sweep.findings() == ["db: sk-tes…"]


def test_sweep_is_quiet_without_a_leak() -> None:
    sweep = SecretSweep()
    sweep.register(KEY)
    sweep.capture("response", '{"hint": "…1234"}')
    assert sweep.findings() == []


@pytest.mark.parametrize("prefix", ["", "u:", "us:", "use:"])  # every base64 alignment
def test_sweep_finds_a_key_base64_encoded_inside_a_longer_value(prefix: str) -> None:
    sweep = SecretSweep()
    sweep.register(KEY)
    sweep.capture("log", "Authorization: Basic " + base64.b64encode(f"{prefix}{KEY}:x".encode()).decode())
    assert sweep.findings() == ["log: sk-tes…"]


@pytest.mark.parametrize(
    "encode",
    [
        lambda key: base64.urlsafe_b64encode(b"\xfb\xff" + key.encode()).decode(),
        lambda key: key.encode().hex(),
        lambda key: "0x" + key.encode().hex().upper(),
        lambda key: quote(key, safe=""),
        lambda key: json.dumps({"key": key}),
    ],
    ids=["base64url", "hex", "HEX", "percent", "json"],
)
def test_sweep_finds_a_key_in_each_encoding(encode: Callable[[str], str]) -> None:
    key = 'sk-"odd"/ké+y%1234'  # characters that percent and JSON encodings change
    sweep = SecretSweep()
    sweep.register(key)
    sweep.capture("response", f"value={encode(key)}&more")
    assert sweep.findings() == ['response: sk-"od…']


def test_sweep_finds_an_encoded_key_in_a_file(tmp_path: Path) -> None:
    (tmp_path / "db").write_bytes(b"\x00" + KEY.encode().hex().encode() + b"\x00")
    sweep = SecretSweep()
    sweep.scan_file(tmp_path / "db", [KEY])
    assert sweep.findings() == ["db: sk-tes…"]


def test_a_hint_or_a_hash_of_the_key_is_not_a_leak() -> None:
    sweep = SecretSweep()
    sweep.register(KEY)
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    sweep.capture(
        "response",
        f'{{"hint": "…{KEY[-4:]}", "sha256": "{digest}", "b64": "{base64.b64encode(digest.encode()).decode()}"}}',
    )
    assert sweep.findings() == []


def test_exposed_names_only_the_secrets_present() -> None:
    other = "sk-test-another-key-5678"
    assert exposed(f"x {base64.b64encode(KEY.encode()).decode()} y", [KEY, other]) == {KEY}
