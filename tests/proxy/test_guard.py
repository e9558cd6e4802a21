"""The connect-time guard: the resolver the upstream client dials through refuses private names and non-public
answers."""

import socket

import pytest

from credgate.proxy.guard import Address, NonPublicAddress, PublicOnlyResolver


class Answers:
    """A resolver whose answers the test chooses (a DNS server that rebinds, say)."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int) -> list[Address]:
        self.asked.append(host)
        return [(address, socket.AF_INET6 if ":" in address else socket.AF_INET) for address in self.addresses]


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
