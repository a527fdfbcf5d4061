"""The SSRF guard reads the IPv4 address an IPv6 one carries (6to4, Teredo, NAT64, IPv4-mapped
and -compatible, ISATAP) and judges it as plain IPv4: ``ipaddress`` alone calls 6to4's
2002::/16 global, so ``https://[2002:7f00:1::1]/`` reached 127.0.0.1 (issue #30)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from metering.webhooks.targets import UrlRefused, address_problem, check_endpoint_url

IPv4 = ipaddress.IPv4Address
IPv6 = ipaddress.IPv6Address

# Every IPv4 range that is not public (IANA's IPv4 Special-Purpose Address Registry).
NON_PUBLIC_IPV4 = [
    ipaddress.IPv4Network(net)
    for net in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
    )
]


@st.composite
def non_public_ipv4(draw: st.DrawFn) -> IPv4:
    """An address in one of those ranges that the guard refuses as plain IPv4 (``ipaddress``
    of Python 3.11.7 calls a few of 192.0.0.0/24's global: the same judgement either way)."""
    network = draw(st.sampled_from(NON_PUBLIC_IPV4))
    address = network[draw(st.integers(0, network.num_addresses - 1))]
    assume(address_problem(address) is not None)
    return address


def bits(n: int) -> st.SearchStrategy[int]:
    return st.integers(0, (1 << n) - 1)


def rfc6052(prefix: int, prefix_length: int, ipv4: IPv4, suffix: int) -> IPv6:
    """RFC 6052 §2.2: the IPv4 octets after the prefix, octet 8 (bits 64-71) left zero."""
    octets = bytearray(prefix.to_bytes(16, "big")[: prefix_length // 8])
    for octet in ipv4.packed:
        if len(octets) == 8:
            octets.append(0)
        octets.append(octet)
    if len(octets) == 8:
        octets.append(0)
    rest = 16 - len(octets)
    octets += (suffix & ((1 << (8 * rest)) - 1)).to_bytes(rest, "big")
    return IPv6(bytes(octets))


LOCAL_USE = 0x64_FF9B_0001 << 80  # 64:ff9b:1::/48 (RFC 8215)

# How an IPv4 address rides in an IPv6 one; each takes the IPv4 and 64 random bits for the
# parts of the IPv6 address the form leaves free.
EMBEDDINGS: dict[str, Callable[[IPv4, int], IPv6]] = {
    "IPv4-mapped": lambda v4, _: IPv6(0xFFFF << 32 | int(v4)),
    "IPv4-compatible": lambda v4, _: IPv6(int(v4) or 2),
    "6to4": lambda v4, free: IPv6(0x2002 << 112 | int(v4) << 80 | free),
    "Teredo server": lambda v4, free: IPv6(0x2001_0000 << 96 | int(v4) << 64 | free),
    "Teredo client": lambda v4, free: IPv6(
        0x2001_0000 << 96 | (free >> 32) << 32 | (int(v4) ^ 0xFFFF_FFFF)
    ),
    "NAT64": lambda v4, _: IPv6(0x64_FF9B << 96 | int(v4)),
    "local-use NAT64 /48": lambda v4, free: rfc6052(LOCAL_USE, 48, v4, free),
    "local-use NAT64 /56": lambda v4, free: rfc6052(LOCAL_USE | free >> 56 << 72, 56, v4, free),
    "local-use NAT64 /64": lambda v4, free: rfc6052(LOCAL_USE | free >> 48 << 64, 64, v4, free),
    "local-use NAT64 /96": lambda v4, free: rfc6052(LOCAL_USE | free >> 16 << 32, 96, v4, 0),
    "ISATAP": lambda v4, free: IPv6(
        (0x2A00_1450 << 96 | (free >> 32) << 64) | 0x0200_5EFE << 32 | int(v4)
    ),
}


@given(ipv4=non_public_ipv4(), how=st.sampled_from(sorted(EMBEDDINGS)), free=bits(64))
def test_a_non_public_ipv4_address_inside_an_ipv6_one_is_refused(
    ipv4: IPv4, how: str, free: int
) -> None:
    address = EMBEDDINGS[how](ipv4, free)
    assert address_problem(address) is not None, (how, str(address))


@given(ipv4=non_public_ipv4(), how=st.sampled_from(sorted(EMBEDDINGS)), free=bits(64))
def test_a_name_whose_aaaa_record_carries_a_non_public_ipv4_address_is_refused(
    ipv4: IPv4, how: str, free: int
) -> None:
    address = str(EMBEDDINGS[how](ipv4, free))
    with pytest.raises(UrlRefused) as refused:
        check_endpoint_url(
            "https://hooks.example.com/x", allow_private=False, resolve=lambda h, p: [address]
        )
    assert refused.value.code == "url_target_forbidden"
    assert address in refused.value.message


@pytest.mark.parametrize(
    ("literal", "named"),
    [
        ("2002:7f00:1::1", "the 6to4 form of 127.0.0.1, a loopback address"),
        ("2002:a9fe:a9fe::1", "the 6to4 form of 169.254.169.254, a link-local address"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo client form of 127.0.0.1"),
        ("64:ff9b::a9fe:a9fe", "the NAT64 form of 169.254.169.254"),
        ("64:ff9b:1::a00:1", "the local-use NAT64 form of 10.0.0.1, a private address"),
    ],
)
def test_the_refusal_names_the_ipv4_address_reached(literal: str, named: str) -> None:
    with pytest.raises(UrlRefused) as refused:
        check_endpoint_url(f"https://[{literal}]/hook", allow_private=False)
    assert refused.value.message.startswith(f"{literal} is ")
    assert named in refused.value.message


@pytest.mark.parametrize(
    "literal",
    [
        "64:ff9b::808:808",  # NAT64's well-known prefix: IANA calls it globally reachable
        "::ffff:8.8.8.8",
        "2002:808:808::1",  # 6to4 of a public address: ipaddress calls it global
        "2a00:1450:4001:82a::200e",
    ],
)
def test_an_ipv6_address_carrying_a_public_ipv4_address_is_judged_as_itself(literal: str) -> None:
    assert address_problem(ipaddress.ip_address(literal)) is None


def test_deprecated_and_local_use_forms_are_refused_even_for_a_public_ipv4_address() -> None:
    for literal in ("::8.8.8.8", "64:ff9b:1::808:808"):
        assert address_problem(ipaddress.ip_address(literal)) is not None, literal
