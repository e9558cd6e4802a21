"""The sweep itself must catch a leak, or its silence would prove nothing."""

from pathlib import Path

from tests.secret_sweep import SecretSweep

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
