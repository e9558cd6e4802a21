"""The SSRF guard: which upstream addresses are public, checked when a base URL is configured and again when
connecting. Unless CREDGATE_ALLOW_PRIVATE_UPSTREAMS is set, loopback, private, link-local (cloud metadata),
multicast, unspecified and other non-global addresses are refused, in every spelling the resolver accepts
(decimal, hex, octal, IPv4-mapped IPv6, names that resolve to them)."""

import asyncio
import ipaddress
import socket
from functools import cache
from urllib.parse import urlsplit


class UpstreamRefused(ValueError):
    """The upstream is not allowed; the message says why, in words for the operator."""


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


@cache
def numeric_host(host: str) -> str | None:
    """The address a numeric host stands for (`2130706433` → 127.0.0.1), without DNS; None for a name."""
    try:
        infos = socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        try:  # the legacy IPv4 spellings (decimal, hex, octal, short) that inet_aton and aiohttp accept
            return socket.inet_ntoa(socket.inet_aton(host))
        except OSError:
            return None
    return str(infos[0][4][0])


async def check_upstream_url(url: str, *, allow_private: bool) -> None:
    """Refuse a base or token URL that is not https or reaches a non-public address (UpstreamRefused).

    A name that does not resolve now is let through: the connection is checked again when it is made.
    """
    if allow_private:
        return
    parts = urlsplit(url)
    if parts.scheme != "https":
        raise UpstreamRefused("must use https (set CREDGATE_ALLOW_PRIVATE_UPSTREAMS for a private upstream)")
    host = parts.hostname or ""
    numeric = numeric_host(host)
    if numeric is not None:
        addresses = [numeric]
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, parts.port or 443, type=socket.SOCK_STREAM)
        except OSError:
            return
        addresses = [str(info[4][0]) for info in infos]
    if not all(is_public(address) for address in addresses):
        raise UpstreamRefused(
            "reaches a loopback, private, link-local or otherwise non-public address "
            "(set CREDGATE_ALLOW_PRIVATE_UPSTREAMS to allow it)"
        )
