"""The SSRF guard at connect time: aiohttp dials only public addresses, however a name resolves today."""

from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from credgate.netguard import is_public, numeric_host


class NonPublicAddress(OSError):
    """Every address of the upstream's name is non-public."""


class PublicOnlyResolver(AbstractResolver):
    """Resolves as usual, then keeps only public addresses; none left is a connection error."""

    def __init__(self) -> None:
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: Any = 0) -> list[ResolveResult]:
        public = [result for result in await self._inner.resolve(host, port, family) if is_public(result["host"])]
        if not public:
            raise NonPublicAddress(f"{host} resolves to no public address")
        return public

    async def close(self) -> None:
        await self._inner.close()


def refuses_numeric_host(host: str) -> bool:
    """aiohttp dials a numeric host without resolving it, so the resolver cannot see it: check it here."""
    address = numeric_host(host)
    return address is not None and not is_public(address)
