"""The servers under test: starting them, knowing when every worker is up, their CPU time."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import psycopg


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, deadline_s: float = 30.0) -> None:
    """Until ``url`` answers below 500: enough for a one-worker server (see wait_ready)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {deadline_s}s")


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen[bytes]

    def processes(self) -> list[psutil.Process]:
        try:
            parent = psutil.Process(self.proc.pid)
            return [parent, *parent.children(recursive=True)]
        except psutil.Error:
            return []

    def workers(self) -> list[psutil.Process]:
        """The processes listening on the port (uvicorn's workers share the parent's socket)."""
        found = []
        for proc in self.processes()[1:]:
            try:
                conns = proc.net_connections(kind="tcp")
            except psutil.Error:
                continue
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port for c in conns):
                found.append(proc)
        return found

    def connections_per_worker(self) -> list[int]:
        """Established client connections held by each worker, busiest first."""
        counts = []
        for proc in self.workers():
            try:
                conns = proc.net_connections(kind="tcp")
            except psutil.Error:
                continue
            counts.append(
                sum(
                    c.status == psutil.CONN_ESTABLISHED and c.laddr.port == self.port for c in conns
                )
            )
        return sorted(counts, reverse=True)

    def cpu_s(self) -> float:
        return cpu_seconds(self.processes())


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _probe(port: int) -> socket.socket | None:
    """A keep-alive connection that got an HTTP answer, left open; None while refused."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return None
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n")
        if not sock.recv(1024).startswith(b"HTTP/1.1"):
            raise OSError("not HTTP")
    except OSError:
        sock.close()
        return None
    return sock


def wait_ready(server: Server, workers: int, deadline_s: float = 90.0) -> None:
    """Until every worker has accepted a connection: the parent's socket answers as soon
    as the first worker is up, and a load started then would all land on that one."""
    deadline = time.monotonic() + deadline_s
    held: list[socket.socket] = []
    try:
        while time.monotonic() < deadline:
            sock = _probe(server.port)
            if sock is not None:
                held.append(sock)
                busy = [n for n in server.connections_per_worker() if n > 0]
                if len(busy) >= workers:
                    return
            time.sleep(0.2)
            if len(held) > 200:
                held.pop(0).close()
        raise TimeoutError(f"{server.name}: {workers} workers not all serving in {deadline_s}s")
    finally:
        for sock in held:
            sock.close()


@contextmanager
def serve(
    name: str, cmd: list[str], env: dict[str, str], port: int, workers: int, cwd: Path
) -> Iterator[Server]:
    """Run ``cmd`` (uvicorn) in its own process group; stop it, and only it, afterwards."""
    proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **env}, start_new_session=True)
    server = Server(name, port, proc)
    try:
        wait_ready(server, workers)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class CpuMeter:
    """CPU seconds spent by a server's processes and by the database's backends meanwhile.

    Unlike requests/s, CPU time per request hardly depends on what else the shared machine
    is doing, so it says where the cost is. Backends that exit meanwhile (a pool closing
    surplus connections) are missed, so the database's share is then a lower bound; the
    count of sessions opened meanwhile tells when.
    """

    def __init__(self, server: Server, server_url: str, database: str) -> None:
        self.server, self.server_url, self.database = server, server_url, database
        self.app_s = server.cpu_s()
        self.backends_s = {p.pid: cpu_seconds([p]) for p in database_backends(server_url, database)}
        self.sessions = database_sessions(server_url, database)

    def new_sessions(self) -> int:
        return database_sessions(self.server_url, self.database) - self.sessions

    def per_unit_ms(self, units: int) -> dict[str, float]:
        backends = database_backends(self.server_url, self.database)
        pg_s = sum(cpu_seconds([p]) - self.backends_s.get(p.pid, 0.0) for p in backends)
        scale = 1000 / max(1, units)
        return {
            "app": round((self.server.cpu_s() - self.app_s) * scale, 3),
            "postgres": round(pg_s * scale, 3),
        }


def database_sessions(url: str, database: str) -> int:
    """Sessions ever opened on ``database`` (PostgreSQL 14 and later)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = %s", (database,)
        ).fetchone()
    return int(row[0]) if row else 0


def database_backends(url: str, database: str) -> list[psutil.Process]:
    """The backends serving clients of ``database`` (not autovacuum); local server only."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                (database,),
            ).fetchall()
    except psycopg.Error:
        return []
    procs = []
    for (pid,) in rows:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return procs
