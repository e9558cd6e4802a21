"""The connect-time guard: the resolver the upstream client dials through refuses private names and non-public
answers."""

import asyncio
import socket

import pytest

from credgate.proxy.guard import Address, NonPublicAddress, PublicOnlyResolver, SystemResolver
from credgate.proxy.http_client import _address_info


class Answers:
    """A resolver whose answers the test chooses (a DNS server that rebinds, say)."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int) -> list[Address]:
        self.asked.append(host)
        return [(address, socket.AF_INET6 if ":" in address else socket.AF_INET) for address in self.addresses]

    def admits(self, address: str) -> bool:
        return True


def guarded(*addresses: str) -> tuple[PublicOnlyResolver, Answers]:
    answers = Answers(*addresses)
    return PublicOnlyResolver(answers), answers


@pytest.mark.parametrize(
    "addresses", [("10.0.0.5",), ("93.184.216.34", "127.0.0.1"), ("::1",), ("64:ff9b::a9fe:a9fe",)]
)
async def test_any_non_public_address_in_the_answer_refuses_the_connection(addresses: tuple[str, ...]) -> None:
    resolver, _ = guarded(*addresses)
    with pytest.raises(NonPublicAddress):
        await resolver.resolve("api.example.com", 443)


async def test_a_private_name_is_refused_before_any_lookup() -> None:
    resolver, answers = guarded("93.184.216.34")
    with pytest.raises(NonPublicAddress):
        await resolver.resolve("metadata.google.internal", 443)
    assert answers.asked == []


async def test_public_answers_are_used() -> None:
    resolver, _ = guarded("93.184.216.34", "2606:2800:220:1::")
    assert [address for address, _ in await resolver.resolve("api.example.com", 443)] == [
        "93.184.216.34",
        "2606:2800:220:1::",
    ]


async def test_the_system_resolver_keeps_an_ipv6_addresss_scope_and_the_client_dials_it_with_its_scope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()

    async def getaddrinfo(host: str, port: int, **_options: object) -> list[object]:
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fe80::1", port, 0, 3)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", port)),
        ]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    addresses = await SystemResolver().resolve("printer.local", 631)
    assert addresses == [("fe80::1%3", socket.AF_INET6), ("192.0.2.1", socket.AF_INET)]
    # The scope in the host as well as in its own field: uvloop's connect reads only the host and the port.
    assert [_address_info(address, family, 631)[4] for address, family in addresses] == [
        ("fe80::1%3", 631, 0, 3),
        ("192.0.2.1", 631),
    ]
