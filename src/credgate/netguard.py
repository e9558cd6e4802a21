"""The SSRF guard: which upstream hosts and addresses are public, decided by one classifier when a base URL is
configured and again when connecting. Unless CREDGATE_ALLOW_PRIVATE_UPSTREAMS is set, loopback, private,
link-local (cloud metadata), shared (CGNAT), multicast, reserved and unspecified addresses are refused in every
spelling: decimal, hex, octal and short IPv4; IPv6 forms that embed an IPv4 address (mapped, compatible, NAT64,
6to4, Teredo); host names that are private by definition (`localhost`, `*.internal`, single labels); and names
that resolve to such addresses. Host names are normalised (case, trailing dot, IDNA) before any decision.
"""

import asyncio
import ipaddress
import re
import socket
from functools import cache
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated (RFC 4291), never a real upstream
# Not global, though the `ipaddress` tables of some Python versions say so: site-local (deprecated, RFC 3879),
# documentation (RFC 9637) and SRv6 SIDs (RFC 9602).
_NOT_GLOBAL = tuple(ipaddress.ip_network(network) for network in ("fec0::/10", "3fff::/20", "5f00::/16"))
# Names private by definition, whatever DNS says today (RFC 6761, 6762, 8375; ICANN's `.internal`, which
# cloud metadata services use: metadata.google.internal, instance-data.ec2.internal).
_PRIVATE_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain", ".arpa")
_PRIVATE_NAMES = frozenset({"localhost", "metadata.goog"})
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")


class UpstreamRefused(ValueError):
    """The upstream is not allowed; the message says why, in words for the operator."""


def is_public(address: str | IPAddress) -> bool:
    """Whether an address (with any IPv4 it embeds) is globally routable and not multicast."""
    ip = address if not isinstance(address, str) else ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _IPV4_COMPATIBLE or ip.teredo is not None or any(ip in network for network in _NOT_GLOBAL):
            return False
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            return is_public(embedded)
    return ip.is_global and not ip.is_multicast


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in network for network in _NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def normalise_host(host: str) -> str:
    """The host as DNS and the resolver see it: lowercase, no trailing dot, IDNA (ASCII) labels.

    UpstreamRefused for anything that is not a host name or an IP address (encoded white space, say)."""
    host = host.lower().removesuffix(".")
    if numeric_host(host) is not None:
        return host
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise UpstreamRefused("is not a valid host name") from None
    if len(ascii_host) > 253 or not all(_LABEL.fullmatch(label) for label in ascii_host.split(".")):
        raise UpstreamRefused("is not a valid host name")
    return ascii_host


def private_by_name(host: str) -> bool:
    """A normalised host name that can only ever mean a local or internal machine."""
    if numeric_host(host) is not None:
        return False
    return "." not in host or host in _PRIVATE_NAMES or host.endswith(_PRIVATE_SUFFIXES)


@cache
def numeric_host(host: str) -> str | None:
    """The address a numeric host stands for (`2130706433` → 127.0.0.1), without DNS; None for a name."""
    host = host.removesuffix(".")
    try:
        infos = socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)
    except UnicodeError:
        return None  # not even encodable as a host name: certainly not numeric
    except socket.gaierror:
        try:  # the legacy IPv4 spellings (decimal, hex, octal, short) that inet_aton and aiohttp accept
            return socket.inet_ntoa(socket.inet_aton(host))
        except OSError:
            return None
    return str(infos[0][4][0])


def refuses_host(host: str) -> bool:
    """Whether a host is non-public by its spelling alone: a numeric non-public address or a private name."""
    try:
        host = normalise_host(host)
    except UpstreamRefused:
        return True
    address = numeric_host(host)
    return not is_public(address) if address is not None else private_by_name(host)


async def check_upstream_url(url: str, *, allow_private: bool) -> None:
    """Refuse a base or token URL that is not a valid host, is not https, or reaches a non-public address
    (UpstreamRefused). A name that does not resolve now is let through: the connection is checked again when
    it is made."""
    parts = urlsplit(url)
    host = normalise_host(parts.hostname or "")
    if allow_private:
        return
    if parts.scheme != "https":
        raise UpstreamRefused("must use https (set CREDGATE_ALLOW_PRIVATE_UPSTREAMS for a private upstream)")
    if refuses_host(host):
        raise _refused()
    if numeric_host(host) is not None:
        return
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, parts.port or 443, type=socket.SOCK_STREAM)
    except OSError:
        return
    if not all(is_public(str(info[4][0])) for info in infos):
        raise _refused()


def _refused() -> UpstreamRefused:
    return UpstreamRefused(
        "reaches a loopback, private, link-local or otherwise non-public address "
        "(set CREDGATE_ALLOW_PRIVATE_UPSTREAMS to allow it)"
    )
