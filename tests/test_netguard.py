"""The SSRF guard's address rules, in every spelling a resolver accepts."""

import pytest

from credgate.netguard import UpstreamRefused, check_upstream_url, is_public, numeric_host

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
]


@pytest.mark.parametrize("url", REFUSED)
async def test_non_public_upstreams_are_refused(url: str) -> None:
    with pytest.raises(UpstreamRefused, match="non-public address"):
        await check_upstream_url(url, allow_private=False)


@pytest.mark.parametrize("url", ["https://8.8.8.8/v1", "https://[2606:4700:4700::1111]/v1"])
async def test_public_addresses_pass(url: str) -> None:
    await check_upstream_url(url, allow_private=False)


async def test_plain_http_needs_the_private_setting() -> None:
    with pytest.raises(UpstreamRefused, match="must use https"):
        await check_upstream_url("http://8.8.8.8/v1", allow_private=False)


async def test_a_name_that_does_not_resolve_now_is_checked_at_connect_time_instead() -> None:
    await check_upstream_url("https://api.does-not-resolve.invalid/v1", allow_private=False)


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
