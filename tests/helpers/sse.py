"""Reading a live status stream over real HTTP, on a thread of its own, as a browser would.

Each block of the stream becomes a dict of its fields (a comment under ``""``) stamped with
the moment it arrived, so a test can ask how soon after a commit a notification got there.
Closing shuts the connection down under the reading thread, as a client that goes away.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True)
class Block:
    fields: dict[str, str]
    arrived: float = field(default_factory=time.monotonic)

    @property
    def event(self) -> str | None:
        return self.fields.get("event")

    @property
    def id(self) -> int | None:
        """The notification's id (the data's; the ``id:`` line is the resume token)."""
        return int(self.data["id"]) if "data" in self.fields else None

    @property
    def token(self) -> str | None:
        """The ``id:`` line: what the client resumes from as ``Last-Event-ID``."""
        return self.fields.get("id")

    @property
    def data(self) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self.fields["data"])
        return body

    @property
    def keep_alive(self) -> bool:
        return self.fields.get("") == "keep-alive"


class StreamReader:
    """``GET url`` as a stream; ``status`` once the reply starts, then its blocks."""

    def __init__(self, url: str, headers: dict[str, str], *, start_timeout_s: float = 60) -> None:
        self.url = url
        self.status: int | None = None
        self.body = ""
        self._headers = headers
        self._blocks: queue.Queue[Block | BaseException] = queue.Queue()
        self._started = threading.Event()
        self._stop = threading.Event()
        self._socket: socket.socket | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        if not self._started.wait(start_timeout_s):
            raise TimeoutError(f"{url} did not answer within {start_timeout_s}s")

    def _read(self) -> None:
        try:
            timeout = httpx.Timeout(30.0, read=30.0)
            with (
                httpx.Client(timeout=timeout) as client,
                client.stream("GET", self.url, headers=self._headers) as reply,
            ):
                self.status = reply.status_code
                self._socket = reply.extensions["network_stream"].get_extra_info("socket")
                if reply.status_code != 200:
                    self.body = reply.read().decode()
                    return
                self._started.set()
                self._parse(reply)
        except BaseException as exc:
            if not self._stop.is_set():  # a hang-up of our own is no error
                self._blocks.put(exc)
        finally:
            self._started.set()

    def _parse(self, reply: httpx.Response) -> None:
        fields: dict[str, str] = {}
        for line in reply.iter_lines():
            if self._stop.is_set():
                return
            if line == "":
                if fields:
                    self._blocks.put(Block(fields))
                fields = {}
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")

    def next(self, timeout_s: float = 10.0) -> Block:
        """The next block (heartbeats included); ``TimeoutError`` when none comes in time."""
        try:
            got = self._blocks.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"nothing from {self.url} within {timeout_s}s") from None
        if isinstance(got, BaseException):
            raise got
        return got

    def events(self, count: int, timeout_s: float = 10.0) -> list[Block]:
        """The next ``count`` events, heartbeats skipped, all within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        found: list[Block] = []
        while len(found) < count:
            block = self.next(max(0.0, deadline - time.monotonic()))
            if block.event is not None:
                found.append(block)
        return found

    def quiet_for(self, seconds: float) -> list[Block]:
        """Every event that arrives within ``seconds`` (heartbeats skipped)."""
        deadline = time.monotonic() + seconds
        found: list[Block] = []
        while (left := deadline - time.monotonic()) > 0:
            try:
                block = self.next(left)
            except TimeoutError:
                break
            if block.event is not None:
                found.append(block)
        return found

    def close(self) -> None:
        """Hang up, as a client that goes away: the connection is shut down under the
        reading thread, which then ends."""
        self._stop.set()
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=60)

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
