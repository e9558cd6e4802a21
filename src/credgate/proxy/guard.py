"""The SSRF guard at connect time: aiohttp dials only public addresses, however a name resolves today."""

from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from credgate.netguard import is_public, refuses_host


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
