"""The SSRF guard at connect time: the upstream client dials only public addresses (or, for an integration with
exceptions, the ones they admit), however a name resolves today."""

import asyncio
import socket
from typing import Protocol

from credgate.netguard import PrivateNetworks, UpstreamRefused, is_public, normalise_host, refuses_host

Address = tuple[str, int]  # an address to dial (an IPv6 link-local one with its scope, "fe80::1%2") and its family


class NonPublicAddress(OSError):
    """The upstream's name is private, or resolves to a non-public address."""


class Resolver(Protocol):
    async def resolve(self, host: str, port: int) -> list[Address]:
        """The addresses `host` may be reached at; raises OSError when there is none, or none allowed."""
        ...

    def admits(self, address: str) -> bool:
        """Whether a literal address (a URL's host, dialled without asking the resolver) may be reached."""
        ...


class SystemResolver:
    """The machine's resolver (getaddrinfo, in the event loop's threads): any address it answers."""

    async def resolve(self, host: str, port: int) -> list[Address]:
        answers = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG
        )
        addresses: list[Address] = []
        for family, _, _, _, sockaddr in answers:
            address = str(sockaddr[0])
            if family == socket.AF_INET6 and len(sockaddr) > 3 and sockaddr[3]:
                address = f"{address}%{sockaddr[3]}"  # a link-local address is dialled through its interface
            addresses.append((address, family))
        return addresses

    def admits(self, address: str) -> bool:
        return True


class PublicOnlyResolver:
    """Resolves as usual; a private name, or any non-public address in the answer, is a connection error (a
    mixed answer is how a rebinding attack looks, so none of it is used)."""

    def __init__(self, inner: Resolver | None = None) -> None:
        self._inner = inner or SystemResolver()

    async def resolve(self, host: str, port: int) -> list[Address]:
        if refuses_host(host):
            raise NonPublicAddress(f"{host} is not a public host")
        addresses = await self._inner.resolve(host, port)
        if not all(self.admits(address) for address, _ in addresses):
            raise NonPublicAddress(f"{host} resolves to a non-public address")
        return addresses

    def admits(self, address: str) -> bool:
        return is_public(address)


class PrivateNetworksResolver:
    """Resolves for one integration's exceptions (`private_networks`): a listed name may resolve to any address
    but a link-local or metadata one; any other name only to public addresses or ones inside a listed network
    (a mixed answer is refused whole, as above)."""

    def __init__(self, exceptions: PrivateNetworks, inner: Resolver | None = None) -> None:
        self._inner = inner or SystemResolver()
        self.exceptions = exceptions

    async def resolve(self, host: str, port: int) -> list[Address]:
        try:
            listed_name = self.exceptions.lists_name(normalise_host(host))
        except UpstreamRefused:
            raise NonPublicAddress(f"{host} is not a valid host") from None
        addresses = await self._inner.resolve(host, port)
        if not all(self.exceptions.admits(address, listed_name=listed_name) for address, _ in addresses):
            raise NonPublicAddress(f"{host} resolves to an address outside the integration's exceptions")
        return addresses

    def admits(self, address: str) -> bool:
        return self.exceptions.admits(address)
