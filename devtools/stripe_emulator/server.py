"""The HTTP/1.1 server: keep-alive, one thread per connection, one write per response.

``EmulatorServer`` is the Python API for tests::

    with EmulatorServer() as server:          # 127.0.0.1, a free port
        client = StripeClient("sk_test_x", base_addresses={"api": server.url})
        ...
        server.state.meter_events             # direct access to the in-memory world

``stop()`` closes the listening socket and every open connection and joins all threads.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from http import HTTPStatus
from types import TracebackType
from typing import Any
from urllib.parse import unquote

from devtools.stripe_emulator import destinations
from devtools.stripe_emulator.control import PREFIX, handle_control
from devtools.stripe_emulator.pipeline import Emulator, Reply
from devtools.stripe_emulator.state import EmulatorState

MAX_LINE = 65536
MAX_HEADERS = 100
MAX_BODY = 10 * 1024 * 1024
IDLE_TIMEOUT_S = 300.0
DELIVER_EVERY_S = 0.1
_REASONS = {status.value: status.phrase for status in HTTPStatus}


class _Request:
    __slots__ = ("body", "close", "headers", "method", "path", "query")

    def __init__(self, method: str, target: str, headers: dict[str, str], body: str) -> None:
        self.method = method
        raw_path, _, self.query = target.partition("?")
        self.path = unquote(raw_path)
        self.headers = headers
        self.body = body
        self.close = headers.get("connection", "").lower() == "close"


class _Handler(socketserver.StreamRequestHandler):
    """Reads requests off one connection until it closes, idles out or the server stops."""

    server: _Server
    disable_nagle_algorithm = True
    timeout = IDLE_TIMEOUT_S

    def handle(self) -> None:
        emulator = self.server.emulator
        while not emulator.stopping.is_set():
            try:
                request = self._read_request()
            except (OSError, ValueError):
                return
            if request is None:
                return
            reply = self._dispatch(emulator, request)
            if reply.drop:
                return
            self._write(reply, request.close)
            if request.close:
                return

    def _dispatch(self, emulator: Emulator, request: _Request) -> Reply:
        if request.path.startswith(PREFIX):
            return handle_control(emulator, request.method, request.path, request.body)
        return emulator.handle_api(
            request.method, request.path, request.query, request.headers, request.body
        )

    def _read_request(self) -> _Request | None:
        line = self.rfile.readline(MAX_LINE)
        while line in (b"\r\n", b"\n"):  # tolerate stray blank lines between requests
            line = self.rfile.readline(MAX_LINE)
        if not line:
            return None
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise ValueError("malformed request line")
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS):
            header = self.rfile.readline(MAX_LINE)
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length") or 0)
        if length < 0 or length > MAX_BODY or "transfer-encoding" in headers:
            raise ValueError("unsupported request body")
        body = self.rfile.read(length).decode() if length else ""
        if parts[2] == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
            headers["connection"] = "close"
        return _Request(parts[0].upper(), parts[1], headers, body)

    def _write(self, reply: Reply, close: bool) -> None:
        head = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Unknown')}"]
        head.extend(f"{name}: {value}" for name, value in reply.headers.items())
        head.append(f"Content-Length: {len(reply.body)}")
        head.append("Connection: close" if close else "Connection: keep-alive")
        head.append("Server: fairmeter-stripe-emulator")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + reply.body
        with contextlib.suppress(OSError):
            self.wfile.write(data)


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    allow_reuse_address = True
    daemon_threads = False  # server_close() joins every connection thread
    block_on_close = True

    def __init__(self, address: tuple[str, int], emulator: Emulator) -> None:
        self.emulator = emulator
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):  # type: ignore[no-untyped-def]
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def hang_up_all(self) -> None:
        """Unblock every connection thread (idle keep-alive reads included)."""
        with self._open_lock:
            sockets = list(self._open)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class EmulatorServer:
    """An emulator on ``host:port`` (port 0: any free port), run in background threads."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        state: EmulatorState | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        """``settings`` change the defaults for this server's life, resets included."""
        self.emulator = Emulator(state or EmulatorState(settings=settings))
        self._server = _Server((host, port), self.emulator)
        self._thread: threading.Thread | None = None
        self._deliverer: threading.Thread | None = None

    @property
    def state(self) -> EmulatorState:
        return self.emulator.state

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> str:
        """Serve in a background thread; returns the base URL."""
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="stripe-emulator",
            daemon=True,
        )
        self._thread.start()
        self._start_deliverer()
        return self.url

    def _start_deliverer(self) -> None:
        """Deliver events queued by API requests (credit notes, lazily made invoices) soon
        after, from their own thread, as Stripe delivers asynchronously."""
        emulator = self.emulator

        def deliver_queued() -> None:
            while not emulator.stopping.wait(DELIVER_EVERY_S):
                state = emulator.state
                if state.settings.auto_deliver and state.book.outbox:
                    destinations.flush(state)

        self._deliverer = threading.Thread(target=deliver_queued, name="emulator-deliverer")
        self._deliverer.start()

    def serve_forever(self) -> None:
        """Serve in the calling thread until ``stop()`` (from a signal handler) or Ctrl-C."""
        self._start_deliverer()
        try:
            self._server.serve_forever(poll_interval=0.2)
        finally:
            self._close()

    def request_stop(self) -> None:
        """Ask ``serve_forever`` to return; safe from a signal handler on the serving thread."""
        threading.Thread(target=self._server.shutdown, daemon=True).start()

    def stop(self) -> None:
        """Stop serving, hang up every connection and join all threads. Idempotent."""
        if self._thread is not None:
            self._server.shutdown()  # would wait forever if serve_forever never ran
            self._thread.join()
            self._thread = None
        if not self.emulator.stopping.is_set():
            self._close()

    def _close(self) -> None:
        self.emulator.stopping.set()
        self._server.hang_up_all()
        self._server.server_close()
        if self._deliverer is not None:
            self._deliverer.join()
            self._deliverer = None

    def __enter__(self) -> EmulatorServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
