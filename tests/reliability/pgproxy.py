"""A TCP proxy in front of PostgreSQL that cuts a connection right after a COMMIT.

It reads the wire protocol in both directions. A transaction is *armed* when a message the
client sent in it contains one of the markers (statement text or bound parameters). When the
server answers an armed transaction's ``COMMIT`` with CommandComplete, the transaction is
durable; the proxy then either drops that message (``drop``: the client never hears the
commit) or forwards it alone (``forward``: the client hears it but not the ReadyForQuery
after it), and resets the client's socket (RST). The client sees its commit fail although it
happened: the textbook ambiguous commit that every retry must turn into a no-op.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tests.helpers.processes import free_port

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
COMMIT_COMPLETE = b"C" + struct.pack("!i", 4 + len(b"COMMIT\x00")) + b"COMMIT\x00"


@dataclass
class Reset:
    marker: bytes
    mode: str  # "drop" | "forward"


@dataclass
class ResetPolicy:
    """Which armed commits to cut: per marker, every ``every``-th one (so the retry that
    follows a cut gets through), at most ``limits[marker]`` times, alternating the modes."""

    limits: dict[bytes, int]
    every: int = 2
    modes: tuple[str, ...] = ("drop", "forward")
    armed_commits: Counter[bytes] = field(default_factory=Counter)
    resets: list[Reset] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def decide(self, marker: bytes) -> str | None:
        with self._lock:
            self.armed_commits[marker] += 1
            done = [r for r in self.resets if r.marker == marker]
            if len(done) >= self.limits[marker] or (self.armed_commits[marker] - 1) % self.every:
                return None
            mode = self.modes[len(done) % len(self.modes)]
            self.resets.append(Reset(marker, mode))
            return mode

    def count(self, marker: bytes, mode: str | None = None) -> int:
        return sum(1 for r in self.resets if r.marker == marker and mode in (None, r.mode))


def _messages(buffer: bytearray) -> Iterator[bytes]:
    """Complete typed messages (type byte + int32 length) taken off the front of ``buffer``."""
    while len(buffer) >= 5:
        length = struct.unpack_from("!i", buffer, 1)[0]
        if len(buffer) < 1 + length:
            return
        message = bytes(buffer[: 1 + length])
        del buffer[: 1 + length]
        yield message


class _Connection:
    """One client connection and its upstream, pumped by one thread with a selector."""

    def __init__(
        self,
        client: socket.socket,
        upstream: tuple[str, int],
        markers: tuple[bytes, ...],
        policy: Callable[[bytes], str | None],
        stopping: threading.Event,
    ) -> None:
        self.client = client
        self.server = socket.create_connection(upstream, timeout=10)
        self.server.settimeout(None)
        self.markers = markers
        self.policy = policy
        self.stopping = stopping
        self.armed: bytes | None = None
        self.from_client = bytearray()
        self.from_server = bytearray()
        self.started = False

    def run(self) -> None:
        try:
            self._pump()
        except OSError:
            pass
        finally:
            for sock in (self.client, self.server):
                with contextlib.suppress(OSError):
                    sock.close()

    def _pump(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.client, selectors.EVENT_READ, self._client_data)
            selector.register(self.server, selectors.EVENT_READ, self._server_data)
            while not self.stopping.is_set():
                for key, _ in selector.select(timeout=0.5):
                    chunk = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not chunk or not key.data(chunk):
                        return

    def _client_data(self, chunk: bytes) -> bool:
        self.from_client += chunk
        if not self.started:
            return self._startup()
        for message in _messages(self.from_client):
            if self.armed is None:
                self.armed = next((m for m in self.markers if m in message), None)
            self.server.sendall(message)
        return True

    def _startup(self) -> bool:
        """Refuse SSL/GSS encryption (the proxy must read the stream), pass the startup on."""
        while len(self.from_client) >= 8:
            length, code = struct.unpack_from("!ii", self.from_client)
            if len(self.from_client) < length:
                return True
            message = bytes(self.from_client[:length])
            del self.from_client[:length]
            if code in (SSL_REQUEST, GSSENC_REQUEST):
                self.client.sendall(b"N")
                continue
            self.server.sendall(message)
            self.started = True
            return self._client_data(b"")
        return True

    def _server_data(self, chunk: bytes) -> bool:
        self.from_server += chunk
        out = bytearray()
        for message in _messages(self.from_server):
            if message == COMMIT_COMPLETE and self.armed is not None:
                mode = self.policy(self.armed)
                if mode is not None:
                    if mode == "forward":
                        out += message
                    self.client.sendall(out)
                    self._reset_client()
                    return False
            if message[:1] == b"Z" and message[5:6] == b"I":  # idle: the transaction ended
                self.armed = None
            out += message
        if out:
            self.client.sendall(out)
        return True

    def _reset_client(self) -> None:
        # SO_LINGER 0: close() sends RST instead of FIN.
        self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.client.close()


class CommitResetProxy:
    """Listen on a free loopback port; forward to ``upstream``; cut armed commits."""

    def __init__(self, upstream: tuple[str, int], policy: ResetPolicy) -> None:
        self.upstream = upstream
        self.markers = tuple(policy.limits)
        self.policy = policy
        self.port = free_port()
        self._stopping = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.5)
        self._threads: list[threading.Thread] = []
        self.connections = 0

    def __enter__(self) -> CommitResetProxy:
        thread = threading.Thread(target=self._accept, name="pg-proxy", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                connection = _Connection(
                    client, self.upstream, self.markers, self.policy.decide, self._stopping
                )
            except OSError:
                client.close()
                continue
            self.connections += 1
            thread = threading.Thread(target=connection.run, name="pg-proxy-conn", daemon=True)
            thread.start()
            self._threads.append(thread)
