"""The SSRF guard's address rules, in every spelling a resolver accepts."""

import asyncio
import socket

import pytest

from credgate.netguard import UpstreamRefused, check_upstream_url, is_public, normalise_host, numeric_host

REFUSED = [
    "https://127.0.0.1/v1",
    "https://localhost/v1",  # a name that resolves to a private address
    "https://[::1]/v1",
    "https://[::ffff:127.0.0.1]/v1",  # IPv4-mapped IPv6
    "https://2130706433/v1",  # decimal
    "https://0x7f000001/v1",  # hex
    "https://0177.0.0.1/v1",  # octal
    "https://127.1/v1",  # short form
    "https://169.254.169.254/latest",  # cloud metadata (link-local)
    "https://10.0.0.1/v1",
    "https://172.16.5.4/v1",
    "https://192.168.1.1/v1",
    "https://100.64.0.1/v1",  # carrier-grade NAT
    "https://0.0.0.0/v1",  # unspecified
    "https://224.0.0.1/v1",  # multicast
    "https://[fe80::1]/v1",
    "https://[fc00::1]/v1",
    "https://[64:ff9b::a9fe:a9fe]/latest",  # NAT64 of the metadata address
    "https://[64:ff9b:1::a00:1]/v1",  # local-use NAT64 of 10.0.0.1
    "https://[2002:a9fe:a9fe::]/latest",  # 6to4 of the metadata address
    "https://[::7f00:1]/v1",  # IPv4-compatible 127.0.0.1
    "https://[::808:808]/v1",  # IPv4-compatible: deprecated, never a real upstream
    "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/v1",  # Teredo
    "https://[fd00:ec2::254]/latest",  # AWS metadata over IPv6
    "https://127.0.0.1./v1",  # trailing dot
    "https://LOCALHOST./v1",
    "https://api.localhost/v1",
    "https://metadata.google.internal/computeMetadata/v1",
    "https://instance-data.ec2.internal/latest",
    "https://metadata.goog/v1",
    "https://metadata/v1",  # a single label: a search domain's internal host
    "https://printer.local/v1",
    "https://router.home.arpa/v1",
    "https://1.0.0.127.in-addr.arpa/v1",
    "https://240.0.0.1/v1",  # reserved
    "https://198.18.0.1/v1",  # benchmarking
    "https://[fec0::1]/v1",  # site-local, deprecated
    "https://[3fff::1]/v1",  # documentation
    "https://[5f00::1]/v1",  # SRv6
]


@pytest.mark.parametrize("url", REFUSED)
async def test_non_public_upstreams_are_refused(url: str) -> None:
    with pytest.raises(UpstreamRefused, match="non-public address"):
        await check_upstream_url(url, allow_private=False)


@pytest.mark.parametrize(
    "url",
    [
        "https://8.8.8.8/v1",
        "https://[2606:4700:4700::1111]/v1",
        "https://[64:ff9b::808:808]/v1",  # NAT64 of a public address
        "https://[2002:808:808::1]/v1",  # 6to4 of a public address
    ],
)
async def test_public_addresses_pass(url: str) -> None:
    await check_upstream_url(url, allow_private=False)


async def test_plain_http_needs_the_private_setting() -> None:
    with pytest.raises(UpstreamRefused, match="must use https"):
        await check_upstream_url("http://8.8.8.8/v1", allow_private=False)


async def test_a_name_that_does_not_resolve_now_is_checked_at_connect_time_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def nxdomain(*args: object, **kwargs: object) -> list[object]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", nxdomain)  # no DNS traffic from the suite
    await check_upstream_url("https://api.example.com/v1", allow_private=False)


@pytest.mark.parametrize("url", [*REFUSED, "http://127.0.0.1:8080/v1"])
async def test_the_setting_allows_private_upstreams(url: str) -> None:
    await check_upstream_url(url, allow_private=True)


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("api.openai.com", None),
    ],
)
def test_numeric_hosts_are_read_without_dns(host: str, address: str | None) -> None:
    assert numeric_host(host) == address


def test_ipv4_mapped_addresses_are_judged_by_their_ipv4() -> None:
    assert not is_public("::ffff:10.0.0.1")
    assert is_public("::ffff:8.8.8.8")


@pytest.mark.parametrize(
    "url",
    ["https://api.openai.com%20/v1", "https://api.openai.com%09/v1", "https://exa mple.com/v1", "https://a..b/v1"],
)
async def test_a_host_that_is_no_host_name_is_refused_whatever_the_setting(url: str) -> None:
    for allow_private in (False, True):
        with pytest.raises(UpstreamRefused, match="not a valid host name"):
            await check_upstream_url(url, allow_private=allow_private)


@pytest.mark.parametrize(
    ("host", "normal"), [("API.OpenAI.com.", "api.openai.com"), ("bücher.example", "xn--bcher-kva.example")]
)
def test_host_names_are_normalised_before_any_decision(host: str, normal: str) -> None:
    assert normalise_host(host) == normal
