"""The SSRF guard at connect time: aiohttp dials only public addresses (or, for an integration with exceptions,
the ones they admit), however a name resolves today."""

from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from credgate.netguard import PrivateNetworks, UpstreamRefused, is_public, normalise_host, refuses_host


class NonPublicAddress(OSError):
    """The upstream's name is private, or resolves to a non-public address."""


class PublicOnlyResolver(AbstractResolver):
    """Resolves as usual; a private name, or any non-public address in the answer, is a connection error (a
    mixed answer is how a rebinding attack looks, so none of it is used)."""

    def __init__(self) -> None:
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: Any = 0) -> list[ResolveResult]:
        if refuses_host(host):
            raise NonPublicAddress(f"{host} is not a public host")
        results = await self._inner.resolve(host, port, family)
        if not all(is_public(result["host"]) for result in results):
            raise NonPublicAddress(f"{host} resolves to a non-public address")
        return results

    async def close(self) -> None:
        await self._inner.close()


class PrivateNetworksResolver(AbstractResolver):
    """Resolves for one integration's exceptions (`private_networks`): a listed name may resolve to any address
    but a link-local or metadata one; any other name only to public addresses or ones inside a listed network
    (a mixed answer is refused whole, as above)."""

    def __init__(self, exceptions: PrivateNetworks) -> None:
        self._inner = DefaultResolver()
        self._exceptions = exceptions

    async def resolve(self, host: str, port: int = 0, family: Any = 0) -> list[ResolveResult]:
        try:
            listed_name = self._exceptions.lists_name(normalise_host(host))
        except UpstreamRefused:
            raise NonPublicAddress(f"{host} is not a valid host") from None
        results = await self._inner.resolve(host, port, family)
        if not all(self._exceptions.admits(result["host"], listed_name=listed_name) for result in results):
            raise NonPublicAddress(f"{host} resolves to an address outside the integration's exceptions")
        return results

    async def close(self) -> None:
        await self._inner.close()
