"""The official SDK's HTTP transport, on ``http.client`` with one kept-alive connection.

Why not the SDK's default (``requests``): measured by ``bench/stripe_sync.py`` on this
project's 2-core machine, ``requests`` + ``urllib3`` cost about 0.9 ms of client CPU per
meter event (session and settings merging, adapter lookup, pool bookkeeping), more than the
SDK's own request building and the emulator's whole request together. The SDK's
``UrllibClient`` is lean but opens a new connection per call (a handshake, and on the server
a new thread, every time); ``HTTPXClient`` (sync or async) measured no better than
``requests``. This class is the SDK's documented extension point (``stripe.HTTPClient``):
the SDK still encodes every request, retries with its own backoff, and parses every reply
and error; only the bytes on the wire are moved by the standard library.

Contract kept from ``RequestsClient``: a connect and a read timeout; TLS verified against
Stripe's CA bundle; timeouts, refused and dropped connections raise ``APIConnectionError``
with ``should_retry=True``; a certificate failure is not retried. A connection that failed,
or that the server closed while idle, is never reused.
"""

from __future__ import annotations

import http.client
import io
import select
import socket
import ssl
import textwrap
from collections.abc import Mapping
from typing import Any, NoReturn, cast
from urllib.parse import urlsplit

import stripe

Origin = tuple[str, str, int]  # scheme, host, port


class _Headers(dict[str, str]):
    """Response headers, looked up case-insensitively (the SDK asks for ``Request-Id`` and
    ``stripe-should-retry`` alike, as ``requests``' CaseInsensitiveDict allows)."""

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)


class KeepAliveClient(stripe.HTTPClient):
    """One persistent connection per thread and origin. Synchronous only."""

    name = "fairmeter-keepalive"

    def __init__(
        self, *, connect_timeout_s: float, read_timeout_s: float, verify_ssl_certs: bool = True
    ) -> None:
        super().__init__(verify_ssl_certs=verify_ssl_certs)
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._tls: ssl.SSLContext | None = None

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None,
        post_data: Any = None,
        *,
        _usage: list[str] | None = None,
    ) -> tuple[Any, int, Mapping[str, str]]:
        parts = urlsplit(url)
        origin = (parts.scheme, parts.hostname or "", parts.port or _default_port(parts.scheme))
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        body = post_data.encode() if isinstance(post_data, str) else post_data
        conn = self._connection(origin)
        try:
            conn.request(method, target or "/", body=body, headers=dict(headers or {}))
            response = conn.getresponse()
            content = response.read()
        except Exception as exc:  # the connection's state is unknown: never reuse it
            self._discard(origin)
            _raise_connection_error(exc)
        found = _Headers((name.lower(), value) for name, value in response.getheaders())
        return content, response.status, found

    def request_stream(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None,
        post_data: Any = None,
        *,
        _usage: list[str] | None = None,
    ) -> tuple[Any, int, Mapping[str, str]]:
        content, status, found = self.request(method, url, headers, post_data)
        return io.BytesIO(content), status, found

    def close(self) -> None:
        for origin in list(self._connections()):
            self._discard(origin)

    def _connections(self) -> dict[Origin, http.client.HTTPConnection]:
        local = self._thread_local
        if not hasattr(local, "connections"):
            local.connections = {}
        connections: dict[Origin, http.client.HTTPConnection] = local.connections
        return connections

    def _connection(self, origin: Origin) -> http.client.HTTPConnection:
        connections = self._connections()
        conn = connections.get(origin)
        if conn is not None and conn.sock is not None and not _idle_and_open(conn.sock):
            self._discard(origin)  # closed by the server while idle (or junk): start afresh
            conn = None
        if conn is None:
            conn = self._new_connection(origin)
            connections[origin] = conn
        if conn.sock is None:  # new, or closed after a "Connection: close" reply
            try:
                conn.connect()
            except Exception as exc:
                self._discard(origin)
                _raise_connection_error(exc)
            cast(socket.socket, conn.sock).settimeout(self._read_timeout_s)
        return conn

    def _new_connection(self, origin: Origin) -> http.client.HTTPConnection:
        scheme, host, port = origin
        if scheme == "http":
            return http.client.HTTPConnection(host, port, timeout=self._connect_timeout_s)
        if self._tls is None:
            self._tls = _tls_context(self._verify_ssl_certs)
        return http.client.HTTPSConnection(
            host, port, timeout=self._connect_timeout_s, context=self._tls
        )

    def _discard(self, origin: Origin) -> None:
        conn = self._connections().pop(origin, None)
        if conn is not None:
            conn.close()


def _default_port(scheme: str) -> int:
    return 80 if scheme == "http" else 443


def _tls_context(verify: bool) -> ssl.SSLContext:
    if not verify:
        return ssl._create_unverified_context()  # noqa: S323 - only when asked for
    return ssl.create_default_context(cafile=stripe.ca_bundle_path)


def _idle_and_open(sock: socket.socket) -> bool:
    """Between requests an open connection has nothing to read; readable means EOF."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return not poller.poll(0)


def _raise_connection_error(exc: Exception) -> NoReturn:
    retry = not isinstance(exc, ssl.SSLCertVerificationError) and isinstance(
        exc, OSError | http.client.HTTPException
    )
    msg = textwrap.fill(
        "Unexpected error communicating with Stripe. If this problem persists, "
        "let us know at support@stripe.com."
    )
    detail = f"{type(exc).__name__}: {exc}"
    error = stripe.APIConnectionError(  # type: ignore[no-untyped-call]
        f"{msg}\n\n(Network error: {detail})", should_retry=retry
    )
    raise error from exc
