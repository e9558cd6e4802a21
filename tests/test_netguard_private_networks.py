"""An integration's exceptions to the SSRF guard (`private_networks`): what may be listed, in which canonical form,
and what the listed entries let through, at save time and at connect time. Link-local and metadata never."""

import asyncio
import socket
from typing import Any

import pytest

from credgate.netguard import (
    NO_PRIVATE_NETWORKS,
    PrivateNetworks,
    UpstreamRefused,
    check_upstream_url,
    never_reachable,
    normalise_private_network,
    normalise_private_networks,
)

CANONICAL = {
    "10.0.0.0/8": "10.0.0.0/8",
    "10.1.2.3/8": "10.0.0.0/8",  # host bits dropped (strict=False)
    " 192.168.1.20 ": "192.168.1.20/32",
    "127.0.0.1": "127.0.0.1/32",
    "2130706433": "127.0.0.1/32",  # the legacy spellings a resolver accepts, read as it reads them
    "0x7f000001": "127.0.0.1/32",
    "fd00::/8": "fd00::/8",
    "FD00:0:0::1/64": "fd00::/64",
    "[::1]": "::1/128",
    "ollama.internal": "ollama.internal",
    "Ollama.Internal.": "ollama.internal",  # case and trailing dot
    "gpu-box": "gpu-box",
    "bücher.internal": "xn--bcher-kva.internal",  # IDNA, as the resolver sees it
}
# Link-local (where the cloud metadata services answer) in every form, the metadata addresses outside it, Teredo,
# networks that contain link-local, and the metadata services' names: never listable.
NEVER = [
    "169.254.0.0/16",
    "169.254.169.254",
    "169.254.10.0/24",
    "169.0.0.0/8",  # contains link-local
    "0.0.0.0/0",
    "::/0",
    "fe80::/10",
    "fe80::1",
    "fe80::1%eth0",
    "[fe80::1]",
    "fd00:ec2::254",  # AWS metadata over IPv6
    "100.100.100.200",  # Alibaba Cloud metadata
    "::ffff:169.254.169.254",  # IPv4-mapped
    "::ffff:169.254.0.0/112",
    "64:ff9b::a9fe:a9fe",  # NAT64
    "2002:a9fe:a9fe::/48",  # 6to4
    "2002::/16",
    "2001::/32",  # Teredo
    "metadata.google.internal",
    "METADATA.GOOGLE.INTERNAL.",
    "instance-data.ec2.internal",
    "metadata.goog",
]
INVALID = ["", "   ", "10.0.0.0/33", "10.0.0.0 /8", "a b", "exa mple.com", "-bad-.example", "x" * 300, "https://x.test"]


@pytest.mark.parametrize(("entry", "canonical"), CANONICAL.items())
def test_an_entry_is_normalised_to_its_canonical_form(entry: str, canonical: str) -> None:
    assert normalise_private_network(entry) == canonical


NEVER_MESSAGES = {  # fixed sentences: the entry itself is never quoted back
    "may never include link-local (169.254.0.0/16, fe80::/10), cloud metadata or Teredo addresses",
    "names a cloud metadata service, which can never be allowed",
}


@pytest.mark.parametrize("entry", NEVER)
def test_link_local_and_metadata_can_never_be_listed(entry: str) -> None:
    with pytest.raises(UpstreamRefused) as refused:
        normalise_private_network(entry)
    assert str(refused.value) in NEVER_MESSAGES


@pytest.mark.parametrize("entry", INVALID)
def test_what_is_no_network_address_or_name_is_refused_without_quoting_it(entry: str) -> None:
    with pytest.raises(UpstreamRefused) as refused:
        normalise_private_network(entry)
    assert not entry.strip() or entry.strip() not in str(refused.value)


def test_a_network_that_merely_contains_a_metadata_address_is_listable_and_the_address_stays_unreachable() -> None:
    exceptions = PrivateNetworks.of(normalise_private_networks(["fd00::/8", "100.64.0.0/10"]))
    assert exceptions.admits("fd00::1")
    assert exceptions.admits("100.64.0.1")
    assert not exceptions.admits("fd00:ec2::254")
    assert not exceptions.admits("100.100.100.200")


def test_the_list_is_deduplicated_in_order_and_an_error_names_the_entry_by_position() -> None:
    assert normalise_private_networks(["gpu-box", "10.0.0.1", "GPU-BOX.", "10.0.0.1/32"]) == ["gpu-box", "10.0.0.1/32"]
    with pytest.raises(ValueError, match=r"^entry 2 may never include link-local"):
        normalise_private_networks(["10.0.0.0/8", "169.254.169.254"])


def test_a_stored_list_edited_by_hand_keeps_only_its_valid_entries() -> None:
    exceptions = PrivateNetworks.of(["169.254.0.0/16", 42, "not a host", "10.0.0.0/8", "gpu-box"])
    assert exceptions == PrivateNetworks.of(["10.0.0.0/8", "gpu-box"])
    assert not exceptions.admits("169.254.169.254")
    assert not PrivateNetworks.of(["169.254.0.0/16"])  # nothing valid: no exception at all


def test_equal_lists_in_any_order_are_one_key() -> None:
    first = PrivateNetworks.of(["10.0.0.0/8", "gpu-box"])
    assert first == PrivateNetworks.of(["gpu-box", "10.0.0.0/8"])
    assert hash(first) == hash(PrivateNetworks.of(["gpu-box", "10.0.0.0/8"]))
    assert first != PrivateNetworks.of(["10.0.0.0/8"])


@pytest.mark.parametrize(
    ("address", "admitted"),
    [
        ("10.1.2.3", True),  # inside the listed network
        ("::ffff:10.1.2.3", True),  # the same, IPv4-mapped
        ("192.168.1.20", True),  # the listed address
        ("192.168.1.21", False),  # its neighbour is not
        ("127.0.0.1", False),
        ("172.16.0.1", False),
        ("8.8.8.8", True),  # public, as for everyone
        ("169.254.169.254", False),
        ("fd00:ec2::254", False),
    ],
)
def test_a_listed_network_admits_its_own_addresses_and_public_ones_only(address: str, admitted: bool) -> None:
    exceptions = PrivateNetworks.of(["10.0.0.0/8", "192.168.1.20"])
    assert exceptions.admits(address) is admitted


def test_a_listed_name_admits_any_address_but_link_local_and_metadata() -> None:
    exceptions = PrivateNetworks.of(["gpu-box"])
    for address in ("127.0.0.1", "10.0.0.5", "::1", "fd12::1"):
        assert exceptions.admits(address, listed_name=True)
    for address in ("169.254.169.254", "169.254.1.1", "fe80::1", "fe80::1%2", "fd00:ec2::254", "::ffff:169.254.1.1"):
        assert never_reachable(address)
        assert not exceptions.admits(address, listed_name=True)


def test_the_spelling_check_lets_listed_hosts_through_and_refuses_the_rest_as_before() -> None:
    exceptions = PrivateNetworks.of(["127.0.0.1", "gpu-box"])
    assert not exceptions.refuses_host("127.0.0.1")
    assert not exceptions.refuses_host("2130706433")  # the same address in another spelling
    assert not exceptions.refuses_host("GPU-BOX.")
    assert exceptions.refuses_host("127.0.0.2")
    assert exceptions.refuses_host("10.0.0.1")
    assert exceptions.refuses_host("169.254.169.254")
    assert not exceptions.refuses_host("api.openai.com")  # a name: its answer decides, when connecting
    assert NO_PRIVATE_NETWORKS.refuses_host("127.0.0.1")
    assert NO_PRIVATE_NETWORKS.refuses_host("gpu-box")  # without exceptions: the guard as it always was


# Save time: check_upstream_url within exceptions, on a resolver the test answers


@pytest.fixture
async def answers(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """DNS answers for the names a test chooses; any other name is unknown (the machine's DNS is never asked)."""
    table: dict[str, list[str]] = {}
    loop = asyncio.get_running_loop()

    async def getaddrinfo(host: str, port: Any, **_options: Any) -> list[Any]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "unknown to the test")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port))) for address in table[host]]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    return table


async def check(url: str, entries: list[str]) -> None:
    await check_upstream_url(url, allow_private=False, exceptions=PrivateNetworks.of(entries), ports=frozenset({443}))


@pytest.mark.parametrize(
    ("url", "entries"),
    [
        ("http://127.0.0.1:11434/v1", ["127.0.0.1"]),  # a listed address: plain http too
        ("http://10.1.2.3:8000/v1", ["10.0.0.0/8"]),
        ("http://[fd00::5]:8000/v1", ["fd00::/8"]),
        ("http://gpu-box:8000/v1", ["gpu-box"]),  # a listed name, whatever it resolves to
        ("http://GPU-BOX.:8000/v1", ["gpu-box"]),
        ("https://vllm.example:8443/v1", ["10.0.0.0/8"]),  # a name answering inside a listed network, over https
        ("https://api.example/v1", ["10.0.0.0/8"]),  # public, as for everyone
    ],
)
async def test_an_upstream_within_the_exceptions_is_accepted_when_configured(
    answers: dict[str, list[str]], url: str, entries: list[str]
) -> None:
    answers |= {"gpu-box": ["127.0.0.1"], "vllm.example": ["10.0.0.7"], "api.example": ["93.184.216.34"]}
    await check(url, entries)


@pytest.mark.parametrize(
    ("url", "entries", "reason"),
    [
        ("http://127.0.0.2:80/v1", ["127.0.0.1"], "outside its private_networks"),  # the neighbour
        ("http://10.0.0.1/v1", ["192.168.0.0/16"], "outside its private_networks"),
        ("https://localhost/v1", ["gpu-box"], "outside its private_networks"),  # another host of the integration
        ("https://mixed.example/v1", ["10.0.0.0/8"], "outside its private_networks"),  # half of it is loopback
        ("http://vllm.example/v1", ["10.0.0.0/8"], "must use https"),  # an unlisted name: https
        ("http://api.example/v1", ["10.0.0.0/8"], "must use https"),
        ("http://meta.example/v1", ["meta.example"], "link-local or cloud metadata"),  # a listed name, never this
        ("http://169.254.169.254/latest", ["gpu-box"], "link-local or cloud metadata"),
        ("http://[fd00:ec2::254]/latest", ["fd00::/8"], "link-local or cloud metadata"),
    ],
)
async def test_an_upstream_outside_the_exceptions_is_refused_when_configured(
    answers: dict[str, list[str]], url: str, entries: list[str], reason: str
) -> None:
    answers |= {"localhost": ["127.0.0.1"], "mixed.example": ["10.0.0.7", "127.0.0.1"], "vllm.example": ["10.0.0.7"]}
    answers |= {"api.example": ["93.184.216.34"], "meta.example": ["169.254.169.254"]}
    with pytest.raises(UpstreamRefused, match=reason):
        await check(url, entries)


@pytest.mark.parametrize(
    ("url", "entries", "refused"),
    [
        ("http://127.0.0.1:11434/v1", ["127.0.0.1"], False),  # a listed address: any port
        ("http://gpu-box:8000/v1", ["gpu-box"], False),  # a listed name: any port
        ("https://vllm.example:8443/v1", ["10.0.0.0/8"], False),  # answering inside a listed network
        ("https://api.example:22/v1", ["10.0.0.0/8"], True),  # public: the port list holds for it as for everyone
        ("https://93.184.216.34:25/v1", ["10.0.0.0/8"], True),
        ("https://unknown.example:22/v1", ["10.0.0.0/8"], True),  # not resolving now: its spelling decides
    ],
)
async def test_the_port_list_holds_for_public_hosts_and_not_for_listed_ones(
    answers: dict[str, list[str]], url: str, entries: list[str], refused: bool
) -> None:
    answers |= {"gpu-box": ["127.0.0.1"], "vllm.example": ["10.0.0.7"], "api.example": ["93.184.216.34"]}
    if refused:
        with pytest.raises(UpstreamRefused, match=r"^port \d+ is not one a public upstream may use"):
            await check(url, entries)
    else:
        await check(url, entries)


async def test_without_exceptions_or_with_the_switch_on_the_check_is_as_before(answers: dict[str, list[str]]) -> None:
    with pytest.raises(UpstreamRefused, match="CREDGATE_ALLOW_PRIVATE_UPSTREAMS"):
        await check("https://127.0.0.1/v1", [])
    await check_upstream_url("http://10.0.0.1/v1", allow_private=True, exceptions=PrivateNetworks.of(["gpu-box"]))
