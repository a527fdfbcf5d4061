"""Where a webhook may go: https to public addresses, checked on the name's resolution at
create time and again at delivery, connecting to the address that was checked."""

from __future__ import annotations

import pytest

from metering.webhooks.targets import (
    UrlRefused,
    check_endpoint_url,
    connection_for,
    parse_url,
)

FORBIDDEN = {
    "127.0.0.1": "loopback",
    "10.1.2.3": "private",
    "172.16.0.9": "private",
    "192.168.1.1": "private",
    "169.254.169.254": "link-local",  # the cloud metadata service
    "100.64.0.1": "not public",  # carrier-grade NAT
    "0.0.0.0": "unspecified",
    "224.0.0.1": "multicast",
    "240.0.0.1": "reserved",
    "::1": "loopback",
    "fe80::1": "link-local",
    "fc00::1": "private",
    "::ffff:127.0.0.1": "loopback",  # IPv4-mapped
    "ff02::1": "multicast",
}


def resolver(*addresses: str):  # type: ignore[no-untyped-def]
    def resolve(host: str, port: int) -> list[str]:
        return list(addresses)

    return resolve


def unresolvable(host: str, port: int) -> list[str]:
    raise OSError("Name or service not known")


@pytest.mark.parametrize(("address", "kind"), FORBIDDEN.items())
def test_a_url_naming_a_non_public_address_is_refused(address: str, kind: str) -> None:
    shown = f"[{address}]" if ":" in address else address
    with pytest.raises(UrlRefused) as refused:
        check_endpoint_url(f"https://{shown}/hook", allow_private=False)
    assert refused.value.code == "url_target_forbidden"
    assert kind in refused.value.message


@pytest.mark.parametrize("address", FORBIDDEN)
def test_a_name_resolving_to_a_non_public_address_is_refused(address: str) -> None:
    with pytest.raises(UrlRefused) as refused:
        check_endpoint_url(
            "https://hooks.example.com/x", allow_private=False, resolve=resolver(address)
        )
    assert refused.value.code == "url_target_forbidden"
    assert address in refused.value.message


def test_one_private_address_among_public_ones_is_enough_to_refuse() -> None:
    with pytest.raises(UrlRefused):
        check_endpoint_url(
            "https://hooks.example.com/x",
            allow_private=False,
            resolve=resolver("93.184.215.14", "10.0.0.1"),
        )


def test_localhost_is_refused_by_what_it_resolves_to() -> None:
    with pytest.raises(UrlRefused) as refused:
        check_endpoint_url("https://localhost:8443/x", allow_private=False)
    assert refused.value.code == "url_target_forbidden"


def test_a_public_address_and_an_unresolvable_name_are_accepted_at_create() -> None:
    check_endpoint_url("https://93.184.215.14/hook", allow_private=False)
    check_endpoint_url("https://not-yet.example.com/h", allow_private=False, resolve=unresolvable)


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("http://93.184.215.14/hook", "url_not_https"),
        ("ftp://93.184.215.14/x", "invalid_url"),
        ("//hooks.example.com/x", "invalid_url"),
        ("hooks.example.com/x", "invalid_url"),
        ("https://user:pw@hooks.example.com/x", "invalid_url"),
        ("https://hooks.example.com/x#frag", "invalid_url"),
        ("https://hooks.example.com:99999/x", "invalid_url"),
        ("https://hooks example.com/x", "invalid_url"),
        ("https://hooks.exämple.com/x", "invalid_url"),
        ("https://hooks_example.com/x", "invalid_url"),
        ("https://hooks.example.com/\x00", "invalid_url"),
        ("https://" + "a" * 2100 + ".com/", "invalid_url"),
        ("", "invalid_url"),
    ],
)
def test_malformed_or_insecure_urls_are_refused(url: str, code: str) -> None:
    with pytest.raises(UrlRefused) as refused:
        check_endpoint_url(url, allow_private=False, resolve=resolver("93.184.215.14"))
    assert refused.value.code == code


def test_the_setting_allows_loopback_and_plain_http() -> None:
    check_endpoint_url("http://127.0.0.1:8080/hook", allow_private=True)
    assert connection_for("http://127.0.0.1:8080/hook", allow_private=True).url == (
        "http://127.0.0.1:8080/hook"
    )


def test_delivery_connects_to_the_address_it_checked_with_the_name_in_host_and_tls() -> None:
    first = connection_for(
        "https://hooks.example.com/in?x=1", allow_private=False, resolve=resolver("93.184.215.14")
    )
    assert first.url == "https://93.184.215.14:443/in?x=1"
    assert first.host_header == "hooks.example.com"
    assert first.server_name == "hooks.example.com"
    other_port = connection_for(
        "https://hooks.example.com:8443", allow_private=False, resolve=resolver("2606:2800::1")
    )
    assert other_port.url == "https://[2606:2800::1]:8443/"
    assert other_port.host_header == "hooks.example.com:8443"


def test_delivery_refuses_a_name_that_now_resolves_to_a_private_address() -> None:
    # Accepted when created (public then); rebound since: refused at delivery.
    check_endpoint_url(
        "https://rebind.example.com/", allow_private=False, resolve=resolver("93.184.215.14")
    )
    with pytest.raises(UrlRefused):
        connection_for(
            "https://rebind.example.com/", allow_private=False, resolve=resolver("127.0.0.1")
        )


def test_an_unresolvable_name_at_delivery_is_an_os_error() -> None:
    with pytest.raises(OSError):
        connection_for("https://gone.example.com/", allow_private=False, resolve=unresolvable)


def test_parse_keeps_path_and_query_and_the_default_port() -> None:
    parsed = parse_url("https://Hooks.Example.com/a/b?c=d", allow_insecure=False)
    assert (parsed.host, parsed.port, parsed.target) == ("hooks.example.com", 443, "/a/b?c=d")
