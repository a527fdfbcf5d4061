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
    """Why a webhook may not be sent to ``address``; ``None`` for a public unicast one."""
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        return address_problem(mapped)
    for kind in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    if not address.is_global:
        return "not public"
    return None


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
                f"{named} a {problem} address: webhooks go to public addresses only",
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
