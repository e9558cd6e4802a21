"""The SSRF guard: which upstream hosts and addresses are public, decided by one classifier when a base URL is
configured and again when connecting. Unless CREDGATE_ALLOW_PRIVATE_UPSTREAMS is set, loopback, private,
link-local (cloud metadata), shared (CGNAT), multicast, reserved and unspecified addresses are refused in every
spelling: decimal, hex, octal and short IPv4; IPv6 forms that embed an IPv4 address (mapped, compatible, NAT64,
6to4, Teredo); host names that are private by definition (`localhost`, `*.internal`, single labels); and names
that resolve to such addresses. Host names are normalised (case, trailing dot, IDNA) before any decision.

An integration may list exceptions of its own (`private_networks`, set by an admin): networks, addresses and host
names it may reach although they are not public. Link-local ranges and the cloud metadata addresses are never an
exception, whatever is listed.
"""

import asyncio
import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Annotated
from urllib.parse import SplitResult, urlsplit

from pydantic import AfterValidator, Field

from credgate.limits import MAX_PRIVATE_NETWORKS

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

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
# Never an exception: link-local ranges (where the cloud metadata services answer), the metadata addresses outside
# them (AWS over IPv6, Alibaba Cloud, Oracle Cloud's legacy one), and Teredo, whose addresses hide the IPv4 host
# they reach. The metadata services' names are refused too, though they resolve to such addresses anyway.
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
_METADATA = tuple(ipaddress.ip_network(address) for address in ("fd00:ec2::254", "100.100.100.200", "192.0.0.192"))
_TEREDO = ipaddress.ip_network("2001::/32")
_METADATA_NAMES = frozenset(
    {"metadata", "metadata.goog", "metadata.google.internal", "instance-data", "instance-data.ec2.internal"}
)
# IPv6 ranges whose addresses carry an IPv4 address, and how many bits above the low end it sits.
_CARRIERS = tuple(
    (ipaddress.IPv6Network(carrier), shift)
    for carrier, shift in (
        ("::ffff:0:0/96", 0),
        ("::/96", 0),
        ("64:ff9b::/96", 0),
        ("64:ff9b:1::/48", 0),
        ("2002::/16", 80),
    )
)


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
        try:  # the legacy IPv4 spellings (decimal, hex, octal, short) that inet_aton and getaddrinfo accept
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


async def check_upstream_url(
    url: str, *, allow_private: bool, exceptions: "PrivateNetworks | None" = None, ports: frozenset[int] | None = None
) -> None:
    """Refuse a base or token URL that is not a valid host, is not https, reaches a non-public address, or (given
    `ports`) a public one on another port (UpstreamRefused), unless the integration's `exceptions` allow it. A name
    that does not resolve now is let through: the connection is checked again when it is made."""
    parts = urlsplit(url)
    host = normalise_host(parts.hostname or "")
    if allow_private:
        return
    if exceptions:
        await _check_with_exceptions(parts, host, exceptions, ports)
        return
    if parts.scheme != "https":
        raise UpstreamRefused("must use https (set CREDGATE_ALLOW_PRIVATE_UPSTREAMS for a private upstream)")
    if refuses_host(host):
        raise _refused()
    _check_port(parts, ports)  # after: a private host is refused as such, whatever its port
    if numeric_host(host) is not None:
        return
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, parts.port or 443, type=socket.SOCK_STREAM)
    except OSError:
        return
    if not all(is_public(str(info[4][0])) for info in infos):
        raise _refused()


def _check_port(parts: SplitResult, ports: frozenset[int] | None) -> None:
    """A public upstream on a port outside `ports`: an SMTP or SSH server is no provider (SS-06)."""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if ports is not None and port not in ports:
        allowed = ", ".join(str(each) for each in sorted(ports))
        raise UpstreamRefused(f"port {port} is not one a public upstream may use (CREDGATE_UPSTREAM_PORTS: {allowed})")


def _refused() -> UpstreamRefused:
    return UpstreamRefused(
        "reaches a loopback, private, link-local or otherwise non-public address "
        "(set CREDGATE_ALLOW_PRIVATE_UPSTREAMS to allow it)"
    )


# An integration's exceptions (private_networks)


def _embedded_ipv4_ranges(network: ipaddress.IPv6Network) -> list[ipaddress.IPv4Network]:
    """The IPv4 ranges that addresses of an IPv6 network carry (mapped, compatible, NAT64, 6to4)."""
    ranges = []
    for carrier, shift in _CARRIERS:
        if network.overlaps(carrier):
            fixed = min(max(network.prefixlen - (96 - shift), 0), 32)  # the IPv4 bits the prefix pins down
            embedded = (int(network.network_address) >> shift) & 0xFFFFFFFF
            ranges.append(ipaddress.IPv4Network((embedded, fixed), strict=False))
    return ranges


def _with_embedded(network: IPNetwork) -> list[IPNetwork]:
    if isinstance(network, ipaddress.IPv6Network):
        return [network, *_embedded_ipv4_ranges(network)]
    return [network]


def _overlaps(network: IPNetwork, ranges: Iterable[IPNetwork]) -> bool:
    return any(network.version == other.version and network.overlaps(other) for other in ranges)


def never_reachable(address: str | IPAddress) -> bool:
    """Whether an address is link-local, a cloud metadata address or Teredo, itself or by an IPv4 address it
    carries: what no exception ever reaches."""
    ip = address if not isinstance(address, str) else ipaddress.ip_address(address.split("%", 1)[0])
    network = ipaddress.ip_network(ip)
    if _overlaps(network, (_TEREDO,)):
        return True
    return any(_overlaps(part, (*_LINK_LOCAL, *_METADATA)) for part in _with_embedded(network))


def _listable(network: IPNetwork) -> bool:
    """A network an admin may list: it touches no link-local range nor Teredo, and is not a metadata address
    (one inside a wider network, as fd00:ec2::254 in fd00::/8, stays unreachable when connecting)."""
    if _overlaps(network, (_TEREDO,)):
        return False
    for part in _with_embedded(network):
        if _overlaps(part, _LINK_LOCAL):
            return False
        if any(part.version == metadata.version and part.subnet_of(metadata) for metadata in _METADATA):  # type: ignore[arg-type]
            return False
    return True


def _as_network(text: str) -> IPNetwork | None:
    """A network or an address in any spelling a resolver accepts; None for what can only be a name."""
    bare = text.removeprefix("[").removesuffix("]")
    try:
        return ipaddress.ip_network(bare, strict=False)
    except ValueError:
        pass
    if "/" in bare:
        raise UpstreamRefused("is not a valid IP network")
    address = numeric_host(bare)
    return None if address is None else ipaddress.ip_network(address.split("%", 1)[0])


def normalise_private_network(entry: str) -> str:
    """One entry of `private_networks` in canonical form: a network (`10.0.0.0/8`; an address becomes a /32 or
    /128) or a host name normalised as the resolver sees it. UpstreamRefused saying why, never quoting it."""
    text = entry.strip()
    if not text or len(text) > 255:
        raise UpstreamRefused("is not an IP network, address or host name")
    network = _as_network(text)
    if network is not None:
        if not _listable(network):
            raise UpstreamRefused(
                "may never include link-local (169.254.0.0/16, fe80::/10), cloud metadata or Teredo addresses"
            )
        return str(network)
    name = normalise_host(text)
    if name in _METADATA_NAMES:
        raise UpstreamRefused("names a cloud metadata service, which can never be allowed")
    return name


def normalise_private_networks(entries: list[str]) -> list[str]:
    """Every entry normalised, duplicates dropped, in the order given; ValueError naming the entry by position."""
    normalised: list[str] = []
    for position, entry in enumerate(entries, start=1):
        try:
            canonical = normalise_private_network(entry)
        except ValueError as error:
            raise ValueError(f"entry {position} {error}") from None
        if canonical not in normalised:
            normalised.append(canonical)
    return normalised


PrivateNetworkList = Annotated[
    list[str], Field(max_length=MAX_PRIVATE_NETWORKS), AfterValidator(normalise_private_networks)
]


@dataclass(frozen=True, slots=True)
class PrivateNetworks:
    """An integration's exceptions, ready for the checks. Hashable: the proxy keys its connection pools by it."""

    networks: frozenset[IPNetwork] = frozenset()
    names: frozenset[str] = frozenset()

    @classmethod
    def of(cls, entries: Iterable[object]) -> "PrivateNetworks":
        """From stored entries. One that is not valid (a row edited by hand) is dropped: it fails closed."""
        networks: set[IPNetwork] = set()
        names: set[str] = set()
        for entry in entries:
            try:
                canonical = normalise_private_network(entry) if isinstance(entry, str) else None
            except ValueError:
                continue
            if canonical is None:
                continue
            network = _as_network(canonical)
            if network is None:
                names.add(canonical)
            else:
                networks.add(network)
        return cls(frozenset(networks), frozenset(names))

    def __bool__(self) -> bool:
        return bool(self.networks or self.names)

    def lists_name(self, host: str) -> bool:
        """Whether a normalised host name is listed."""
        return host in self.names

    def in_networks(self, address: str | IPAddress) -> bool:
        """Whether an address, or the IPv4 address it carries, is inside a listed network (and reachable)."""
        ip = address if not isinstance(address, str) else ipaddress.ip_address(address.split("%", 1)[0])
        if never_reachable(ip):
            return False
        candidates: list[IPAddress] = [ip]
        if isinstance(ip, ipaddress.IPv6Address) and (embedded := _embedded_ipv4(ip)) is not None:
            candidates.append(embedded)
        return any(candidate in network for candidate in candidates for network in self.networks)

    def admits(self, address: str | IPAddress, *, listed_name: bool = False) -> bool:
        """Whether a connection may go to `address`: never a link-local or metadata one; any other address of a
        listed name; otherwise a public address or one inside a listed network."""
        if never_reachable(address):
            return False
        return listed_name or is_public(address) or self.in_networks(address)

    def refuses_host(self, host: str) -> bool:
        """`refuses_host` for an integration with these exceptions: a listed name, or a numeric address they
        admit, is not refused by its spelling; any other name is judged by its answer when connecting."""
        if not self:
            return refuses_host(host)
        try:
            host = normalise_host(host)
        except UpstreamRefused:
            return True
        address = numeric_host(host)
        if address is None:
            return False
        return not self.admits(address)


NO_PRIVATE_NETWORKS = PrivateNetworks()


async def _check_with_exceptions(
    parts: SplitResult, host: str, exceptions: PrivateNetworks, ports: frozenset[int] | None
) -> None:
    """The save-time check of an integration with exceptions: a listed name may use plain http, any port, and
    resolve to any address but a link-local or metadata one; a numeric host inside a listed network may use plain
    http and any port; any other host must be https and every address it resolves to public or inside a listed
    network, and a public one keeps the port list."""
    listed_name = exceptions.lists_name(host)
    address = numeric_host(host)
    if address is not None:
        if exceptions.in_networks(address):
            return
        if not is_public(address):
            raise _refused_by_exceptions(address)
    if parts.scheme != "https" and not listed_name:
        raise UpstreamRefused("must use https, unless its host is listed in private_networks")
    if address is not None:
        _check_port(parts, ports)
        return
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, parts.port or 443, type=socket.SOCK_STREAM)
    except OSError:
        infos = []
    addresses = [str(info[4][0]) for info in infos]
    for each in addresses:
        if not exceptions.admits(each, listed_name=listed_name):
            raise _refused_by_exceptions(each)
    if not listed_name and not any(exceptions.in_networks(each) for each in addresses):
        _check_port(parts, ports)


def _refused_by_exceptions(address: str) -> UpstreamRefused:
    if never_reachable(address):
        return UpstreamRefused("reaches a link-local or cloud metadata address, which is never allowed")
    return UpstreamRefused(
        "reaches a loopback, private, link-local or otherwise non-public address outside its private_networks"
    )
