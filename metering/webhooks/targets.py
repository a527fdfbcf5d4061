"""Where a webhook may be sent: the URL rules and the server-side request forgery guard.

An endpoint's URL is the tenant's to choose, and our workers sit inside our network, so a
URL naming (or resolving to) a loopback, private, link-local, multicast or reserved address
would let a tenant make us call our own services. Such targets are refused when the
endpoint is created or changed, and again at every delivery after resolving the name: a
name can point somewhere else by then (DNS rebinding). The delivery connects to the very
address that was checked, so no second lookup can differ from the one judged.

``webhooks_allow_private`` lifts both the address rule and the https rule, for the tests
and ``make up``'s demo, whose receivers listen on loopback.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

MAX_URL_CHARS = 2048
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
    r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?$"
)

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]


class UrlRefused(ValueError):
    """The URL cannot be an endpoint; ``code`` says which rule it breaks."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class WebhookUrl:
    scheme: str
    host: str  # as written, without brackets around an IPv6 literal
    port: int
    target: str  # path and query, at least "/"

    def with_address(self, address: str) -> str:
        """The same URL aimed at ``address`` (the Host header and TLS name stay the host)."""
        shown = f"[{address}]" if ":" in address else address
        return f"{self.scheme}://{shown}:{self.port}{self.target}"


def parse_url(url: str, *, allow_insecure: bool) -> WebhookUrl:
    """The URL's parts, or :class:`UrlRefused`. https only unless ``allow_insecure``; no
    credentials, no fragment, a plain ASCII host name or an IP literal."""
    if len(url) > MAX_URL_CHARS:
        raise UrlRefused("invalid_url", f"a URL has at most {MAX_URL_CHARS} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url) or not url.isascii():
        raise UrlRefused("invalid_url", "a URL holds no spaces, control or non-ASCII characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UrlRefused("invalid_url", f"not a URL: {exc}") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise UrlRefused("invalid_url", "an absolute https:// URL is needed")
    if parts.scheme == "http" and not allow_insecure:
        raise UrlRefused("url_not_https", "webhooks are sent over https only")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("invalid_url", "credentials in the URL are not supported")
    if parts.fragment or url.endswith("#"):
        raise UrlRefused("invalid_url", "a webhook URL has no #fragment")
    host = parts.hostname
    if _ip(host) is None and not _HOSTNAME.fullmatch(host):
        raise UrlRefused("invalid_url", f"{host!r} is not a host name or an IP address")
    return WebhookUrl(parts.scheme, host, port or _default_port(parts), _target(parts))


def _default_port(parts: SplitResult) -> int:
    return 443 if parts.scheme == "https" else 80


def _target(parts: SplitResult) -> str:
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _ip(text: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def address_problem(address: IpAddress) -> str | None:
    """Why a webhook may not be sent to ``address`` (``"a loopback address"``); ``None`` for a
    public unicast one. An IPv4 address carried inside an IPv6 one is judged first, as plain
    IPv4 is (:func:`embedded_ipv4`): ``ipaddress`` calls 6to4's 2002::/16 global, so
    2002:7f00:1:: would otherwise reach 127.0.0.1 through a 6to4 relay."""
    if isinstance(address, ipaddress.IPv6Address):
        for via, ipv4 in embedded_ipv4(address):
            problem = _own_problem(ipv4)
            if problem is not None:
                return f"the {via} form of {ipv4}, {problem}"
        if address.ipv4_mapped is not None or address in _NAT64_WELL_KNOWN:
            return None  # these stand for their IPv4 address alone, judged public above
    return _own_problem(address)


def _own_problem(address: IpAddress) -> str | None:
    for kind in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):
        if getattr(address, f"is_{kind}"):
            return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind.replace('_', '-')} address"
    if not address.is_global:
        return "a not public address"
    return None


# The IPv6 forms that carry an IPv4 address a packet may end up at: IANA's IPv6
# Special-Purpose Address Registry, RFC 4291 §2.5.5 (IPv4-compatible, IPv4-mapped),
# RFC 3056 (6to4), RFC 4380 §4 (Teredo), RFC 6052 §2 (NAT64's formats) with RFC 8215's
# local-use prefix, and RFC 5214 §6.1 (ISATAP interface identifiers, under any prefix).
# Network-specific NAT64 prefixes (RFC 6052 §2.3) are an operator's choice and cannot be
# known here: a deployment with one refuses it at its egress.
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_RFC6052_LENGTHS_IN_LOCAL_USE = (96, 64, 56, 48)  # the RFC 6052 lengths inside a /48
_ISATAP_MARK = 0x0000_5EFE  # RFC 5214 §6.1, with the u and g bits masked off
_U_AND_G_BITS = 0x0300_0000


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    """Every IPv4 address ``address`` carries, each with the name of the form carrying it;
    for a local-use NAT64 address every RFC 6052 position, its prefix length being the
    operator's."""
    found: list[tuple[str, ipaddress.IPv4Address]] = []
    value = int(address)
    if address.ipv4_mapped is not None:
        found.append(("IPv4-mapped", address.ipv4_mapped))
    if address in _IPV4_COMPATIBLE and value > 1:  # :: and ::1 are not IPv4-compatible
        found.append(("IPv4-compatible", ipaddress.IPv4Address(value & 0xFFFF_FFFF)))
    if address.sixtofour is not None:
        found.append(("6to4", address.sixtofour))
    if address.teredo is not None:
        server, client = address.teredo
        found += [("Teredo server", server), ("Teredo client", client)]
    if address in _NAT64_WELL_KNOWN:
        found.append(("NAT64", ipaddress.IPv4Address(value & 0xFFFF_FFFF)))
    if address in _NAT64_LOCAL_USE:
        found += [
            ("local-use NAT64", _rfc6052_ipv4(address, n)) for n in _RFC6052_LENGTHS_IN_LOCAL_USE
        ]
    if (value >> 32) & 0xFFFF_FFFF & ~_U_AND_G_BITS == _ISATAP_MARK:
        found.append(("ISATAP", ipaddress.IPv4Address(value & 0xFFFF_FFFF)))
    return found


def _rfc6052_ipv4(address: ipaddress.IPv6Address, prefix_length: int) -> ipaddress.IPv4Address:
    """The IPv4 address after a NAT64 prefix of ``prefix_length`` bits (RFC 6052 §2.2: its
    32 bits follow the prefix, skipping bits 64 to 71, which are zero)."""
    packed = address.packed
    start = prefix_length // 8
    octets = [packed[i] for i in range(start, 16) if i != 8][:4]
    return ipaddress.IPv4Address(bytes(octets))


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the system resolver, as a connection would)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def refuse_private(url: WebhookUrl, addresses: list[str]) -> None:
    """:class:`UrlRefused` when any of ``addresses`` is not a public one (a name with one
    private address among public ones is refused too: which one a client picks varies)."""
    for text in addresses:
        address = _ip(text.split("%", 1)[0])
        problem = "not an address" if address is None else address_problem(address)
        if problem is not None:
            named = f"{text} is" if text == url.host else f"{url.host} resolves to {text},"
            raise UrlRefused(
                "url_target_forbidden",
                f"{named} {problem}: webhooks go to public addresses only",
            )


def check_endpoint_url(
    url: str, *, allow_private: bool, resolve: Resolver = system_resolver
) -> WebhookUrl:
    """The check when an endpoint is created or changed. A name that does not resolve yet
    is accepted (its DNS may come later); every delivery checks again."""
    parsed = parse_url(url, allow_insecure=allow_private)
    if allow_private:
        return parsed
    if _ip(parsed.host) is not None:
        refuse_private(parsed, [parsed.host])
        return parsed
    try:
        addresses = resolve(parsed.host, parsed.port)
    except (OSError, UnicodeError):
        return parsed
    refuse_private(parsed, addresses)
    return parsed


@dataclass(frozen=True, slots=True)
class Connection:
    """Where one delivery connects: ``url`` (an address when pinned), the ``host`` header
    and the TLS server name to send (``None``: those of ``url`` itself)."""

    url: str
    host_header: str | None
    server_name: str | None


def connection_for(
    url: str, *, allow_private: bool, resolve: Resolver = system_resolver
) -> Connection:
    """The check at delivery time: resolve the name once, refuse a non-public address
    (:class:`UrlRefused`), and pin the connection to the address checked. An unresolvable
    name is an ``OSError`` the caller records as the attempt's failure."""
    parsed = parse_url(url, allow_insecure=allow_private)
    if allow_private:
        return Connection(url, None, None)
    addresses = [parsed.host] if _ip(parsed.host) is not None else resolve(parsed.host, parsed.port)
    refuse_private(parsed, addresses)
    default = parsed.port == (443 if parsed.scheme == "https" else 80)
    host_header = parsed.host if default else f"{parsed.host}:{parsed.port}"
    if ":" in parsed.host:  # an IPv6 literal keeps its brackets in the Host header
        host_header = f"[{parsed.host}]" + ("" if default else f":{parsed.port}")
    return Connection(parsed.with_address(addresses[0]), host_header, parsed.host)
