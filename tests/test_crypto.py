"""The key ring (AES-256-GCM, key ids, associated data), token generation and hashing, and `Secret`."""

import re
from collections.abc import Sequence

import pytest

from credgate import crypto
from credgate.crypto import (
    DecryptionError,
    KeyRing,
    MasterKeyFormatError,
    Secret,
    ciphertext_key_id,
    decode_master_key,
    encode_master_key,
    generate_token,
    hash_token,
    master_key_id,
    new_master_key,
    secret_binding,
)

PLAINTEXT = b"sk-test-abcdefghijklmnopqrstuvwx"
BINDING = secret_binding(project_id="prj_1", provider="openai", purpose="api_key")


def test_a_sealed_secret_opens_to_the_same_bytes() -> None:
    ring = KeyRing([new_master_key()])
    sealed = ring.seal(PLAINTEXT, aad=BINDING)
    assert PLAINTEXT not in sealed
    assert ring.open(sealed, aad=BINDING) == PLAINTEXT


def test_sealing_twice_gives_different_ciphertexts() -> None:
    ring = KeyRing([new_master_key()])
    assert ring.seal(PLAINTEXT, aad=BINDING) != ring.seal(PLAINTEXT, aad=BINDING)


@pytest.mark.parametrize(
    "other",
    [
        {"project_id": "prj_2", "provider": "openai", "purpose": "api_key"},
        {"project_id": "prj_1", "provider": "anthropic", "purpose": "api_key"},
        {"project_id": "prj_1", "provider": "openai", "purpose": "oauth_client_secret"},
        # The separator keeps fields apart: ("prj_1o", "penai") is not ("prj_1", "openai").
        {"project_id": "prj_1o", "provider": "penai", "purpose": "api_key"},
    ],
    ids=["project", "provider", "purpose", "field boundary"],
)
def test_a_ciphertext_opens_only_under_its_own_binding(other: dict[str, str]) -> None:
    ring = KeyRing([new_master_key()])
    sealed = ring.seal(PLAINTEXT, aad=BINDING)
    with pytest.raises(DecryptionError):
        ring.open(sealed, aad=secret_binding(**other))


@pytest.mark.parametrize("position", [0, 1, 5, 17, -1], ids=["version", "key id", "nonce", "body", "tag"])
def test_a_tampered_ciphertext_does_not_open(position: int) -> None:
    ring = KeyRing([new_master_key()])
    sealed = bytearray(ring.seal(PLAINTEXT, aad=BINDING))
    sealed[position] ^= 0x01
    with pytest.raises(DecryptionError):
        ring.open(bytes(sealed), aad=BINDING)


@pytest.mark.parametrize("blob", [b"", b"\x01", b"\x02" + bytes(40)], ids=["empty", "header only", "bad version"])
def test_what_is_not_a_ciphertext_does_not_open(blob: bytes) -> None:
    with pytest.raises(DecryptionError):
        KeyRing([new_master_key()]).open(blob, aad=BINDING)


def test_every_ciphertext_names_the_key_that_sealed_it() -> None:
    key = new_master_key()
    ring = KeyRing([key])
    assert ciphertext_key_id(ring.seal(PLAINTEXT, aad=BINDING)) == master_key_id(key).hex() == ring.primary_key_id


def test_a_ring_of_new_and_old_keys_opens_both_and_seals_under_the_new() -> None:
    new, old = new_master_key(), new_master_key()
    under_old = KeyRing([old]).seal(PLAINTEXT, aad=BINDING)
    ring = KeyRing([new, old])
    assert ring.open(under_old, aad=BINDING) == PLAINTEXT
    assert ciphertext_key_id(ring.seal(PLAINTEXT, aad=BINDING)) == master_key_id(new).hex()


def test_a_key_the_ring_does_not_hold_triggers_a_reload() -> None:
    old, new = new_master_key(), new_master_key()
    reloads: list[Sequence[bytes]] = []

    def reload() -> Sequence[bytes]:
        reloads.append([new, old])
        return [new, old]

    ring = KeyRing([old], reload=reload)
    assert ring.open(KeyRing([new]).seal(PLAINTEXT, aad=BINDING), aad=BINDING) == PLAINTEXT
    assert len(reloads) == 1
    assert ring.primary_key_id == master_key_id(new).hex()


def test_a_key_nobody_holds_fails_without_a_reload_source() -> None:
    sealed = KeyRing([new_master_key()]).seal(PLAINTEXT, aad=BINDING)
    with pytest.raises(DecryptionError, match="does not hold"):
        KeyRing([new_master_key()]).open(sealed, aad=BINDING)


def test_sealing_picks_up_a_newer_key_from_the_reload_source() -> None:
    old, new = new_master_key(), new_master_key()
    keys = [old]
    ring = KeyRing(keys, reload=lambda: keys)
    keys.insert(0, new)  # another process rotated the key file
    assert ciphertext_key_id(ring.seal(PLAINTEXT, aad=BINDING)) == master_key_id(new).hex()


def test_a_key_a_rotation_dropped_stops_counting_for_the_tags_it_made(monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = new_master_key(), new_master_key()
    keys = [old]
    ring = KeyRing(keys, reload=lambda: list(keys))
    tag = ring.tag(b"message", purpose=b"test")
    assert ring.check_tag(b"message", tag, purpose=b"test")
    keys[:] = [new]  # another process finished a rotation: the old key is gone from the key file
    assert ring.holds_key_of(tag)  # this process has not re-read the file yet (it does every 10 s)
    monkeypatch.setattr(crypto, "_TAG_REFRESH_SECONDS", 0)  # now it has
    assert not ring.holds_key_of(tag)
    assert not ring.check_tag(b"message", tag, purpose=b"test")
    assert ring.check_tag(b"message", ring.tag(b"message", purpose=b"test"), purpose=b"test")


def test_a_ring_needs_a_key() -> None:
    with pytest.raises(MasterKeyFormatError):
        KeyRing([])


@pytest.mark.parametrize("prefix", ["cgp_", "cga_"])
def test_tokens_carry_their_prefix_and_at_least_256_random_bits(prefix: str) -> None:
    tokens = {generate_token(prefix) for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:
        assert token.startswith(prefix)
        random_part = token.removeprefix(prefix)
        assert re.fullmatch(r"[A-Za-z0-9_-]+", random_part)
        assert len(random_part) * 6 >= 256  # base64url: six bits per character


def test_hash_token_is_sha256_hex() -> None:
    assert hash_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_a_secret_never_shows_its_value() -> None:
    secret = Secret("sk-test-abcdefghijklmnopqrstuvwx")
    for shown in (repr(secret), str(secret), f"{secret}", f"{secret!r}", repr([secret]), repr({"key": secret})):
        assert "abcdefgh" not in shown
    assert secret.reveal() == "sk-test-abcdefghijklmnopqrstuvwx"
    assert secret == Secret("sk-test-abcdefghijklmnopqrstuvwx") != Secret("sk-test-other")


def test_a_master_key_survives_encoding() -> None:
    key = new_master_key()
    text = encode_master_key(key)
    assert len(key) == 32
    assert decode_master_key(text) == key
    assert decode_master_key(f"  {text}\n") == key


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not a key",
        encode_master_key(bytes(31)),
        encode_master_key(bytes(33)),
        encode_master_key(bytes(64)),
        encode_master_key(bytes(32))[:-2] + "**",
        encode_master_key(bytes(32)) + "****",
    ],
    ids=["empty", "words", "31 bytes", "33 bytes", "two keys joined", "stars inside", "stars after"],
)
def test_decode_master_key_rejects_what_is_not_32_bytes_of_base64url(text: str) -> None:
    with pytest.raises(MasterKeyFormatError):
        decode_master_key(text)
