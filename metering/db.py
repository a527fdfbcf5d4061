"""Engine, sessions and the unit of work.

``unit_of_work`` is the only place that commits: the edge (a request handler's dependency,
a Celery task wrapper, a CLI command) opens one per use case.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from metering.config import Settings

if TYPE_CHECKING:
    from sqlmodel import Session

# Sessions run in UTC whatever the server's default: timestamps come back with
# ``datetime.UTC`` as their tzinfo (psycopg maps the session's zone; "Etc/UTC", a common
# server default, would give a ZoneInfo), which the policy takes as it is instead of
# converting every event and usage line of a run.
SESSION_OPTIONS = "-c TimeZone=UTC"


def create_db_engine(settings: Settings) -> Engine:
    """A pooled psycopg 3 engine. ``pool_pre_ping`` survives a restarted PostgreSQL."""
    return sa.create_engine(
        settings.sqlalchemy_url(),
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_pre_ping=True,
        pool_timeout=10,
        connect_args={"connect_timeout": 5, "options": SESSION_OPTIONS},
    )


@contextmanager
def unit_of_work(engine: Engine) -> Iterator[Session]:
    """One transaction: commit when the block ends normally, roll back on any exception."""
    # Imported here: SQLModel brings in SQLAlchemy's ORM, which a process that only sends
    # SQL through raw_transaction (most `fairmeter` commands) never needs.
    from sqlmodel import Session

    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


@contextmanager
def raw_transaction(engine: Engine) -> Iterator[psycopg.Connection[Any]]:
    """One transaction on a pooled connection, as the bare psycopg connection.

    For hot paths that send hand-written SQL (ingest, sweeps); commits on success and rolls
    back on any exception, exactly like :func:`unit_of_work`.
    """
    with engine.begin() as connection:
        driver = connection.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        yield driver


@dataclass(frozen=True)
class StatementLimits:
    """How long one statement of a heavy use case may run in PostgreSQL, and how long it may
    wait for a lock: no longer than its client waits for the reply (config.py)."""

    statement_timeout_s: float
    lock_timeout_s: float

    def options(self) -> str:
        """A worker process's connection options: the session's, and these limits (the
        request's own connection gets them from ``bounded_transaction``)."""
        statement_ms = round(self.statement_timeout_s * 1000)
        lock_ms = round(self.lock_timeout_s * 1000)
        return (
            f"{SESSION_OPTIONS} -c statement_timeout={statement_ms}ms -c lock_timeout={lock_ms}ms"
        )


class QueryGuard:
    """Lets another thread cancel what a use case runs in PostgreSQL: its client went away,
    or its time is up. Work that runs on after its client gave up holds a pooled connection
    and row locks for nobody (issue #30: an abandoned export ran on for five minutes).

    ``cancel`` sends PostgreSQL a cancel request for the statement running now; a use case
    between statements (replaying in Python) is cancelled by the next call, so the canceller
    calls it again until the work ends. The lock is held while cancelling: the connection
    cannot go back to the pool, and another request's query be cancelled, meanwhile.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self.cancelled = False

    @contextmanager
    def watching(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """``conn`` may be cancelled while the block runs (at once when already cancelled)."""
        with self._lock:
            self._conn = conn
            if self.cancelled:
                raise psycopg.errors.QueryCanceled("cancelled before it started")
        try:
            yield
        finally:
            with self._lock:
                self._conn = None

    def cancel(self) -> None:
        """Cancel the statement running now, and refuse to start new work."""
        with self._lock:
            self.cancelled = True
            if self._conn is not None and not self._conn.closed:
                self._conn.cancel_safe(timeout=2.0)


def terminate_backends(conninfo: str, application_prefix: str) -> None:
    """End every backend whose ``application_name`` starts with ``application_prefix``: the
    connections of worker processes doing a cancelled request's work (a what-if's shards, an
    OTLP export's store), which the request's own ``QueryGuard`` cannot reach. Their open
    transactions roll back. On a connection of its own (the request's may be being cancelled
    meanwhile); out of reach of the database, the workers' ``statement_timeout`` still ends
    them."""
    pattern = application_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    with (
        contextlib.suppress(psycopg.Error),
        psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as admin,
    ):
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE %s",
            (pattern + "%",),
        )


@contextmanager
def bounded_transaction(
    engine: Engine, limits: StatementLimits, guard: QueryGuard | None = None
) -> Iterator[psycopg.Connection[Any]]:
    """Like :func:`raw_transaction`, with every statement bounded by ``limits`` and
    cancellable through ``guard``.

    The limits are set for the session, not ``SET LOCAL``: a use case may end transactions
    itself (a what-if replay opens its own REPEATABLE READ snapshot), and a local setting
    would end with the first. They are reset before the connection goes back to the pool;
    a connection that cannot be reset is closed instead, never pooled with them.
    """
    with engine.connect() as connection:
        driver = connection.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        _set_limits(driver, limits)
        try:
            with guard.watching(driver) if guard is not None else nullcontext():
                yield driver
                driver.commit()
        except BaseException:
            _quietly(driver.rollback)
            raise
        finally:
            if not _quietly(lambda: _set_limits(driver, None)):
                connection.invalidate()


def _set_limits(conn: psycopg.Connection[Any], limits: StatementLimits | None) -> None:
    """Session settings, committed; ``None`` puts the server's defaults back."""
    if limits is None:
        conn.execute("RESET statement_timeout")
        conn.execute("RESET lock_timeout")
    else:
        statement_ms = round(limits.statement_timeout_s * 1000)
        lock_ms = round(limits.lock_timeout_s * 1000)
        conn.execute(
            "SELECT set_config('statement_timeout', %s, false),"
            " set_config('lock_timeout', %s, false)",
            (f"{statement_ms}ms", f"{lock_ms}ms"),
        )
    conn.commit()


def _quietly(step: Any) -> bool:
    """Run ``step``; whether it worked (a broken connection is dropped by the caller)."""
    try:
        step()
    except psycopg.Error:
        return False
    return True


def timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is a statement cancelled (a timeout, or :class:`QueryGuard`) or a
    lock not granted in ``lock_timeout``: this request's time ran out, retrying may pass."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
        exc = exc.orig
    return isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable)


# SQLSTATE classes and codes that say the database cannot serve anyone right now:
# connection exceptions (08), insufficient resources (53), and a server shutting down or
# starting (57P01-57P03). A query cancelled by a timeout (57014) or a deadlock (40P01) is not
# among them: those belong to one transaction.
_UNAVAILABLE_CLASSES = ("08", "53")
_UNAVAILABLE_CODES = frozenset({"57P01", "57P02", "57P03"})


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means the database is unreachable or lost the connection, whatever
    the transaction did: no request's fault, so retrying one request after another only
    waits for it again (a connect timeout each)."""
    if isinstance(exc, sa.exc.TimeoutError):  # no pooled connection came free in time
        return True
    if isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig if exc.orig is not None else exc
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg.OperationalError | sa.exc.OperationalError):
        state = getattr(exc, "sqlstate", None)
        return state is None or state[:2] in _UNAVAILABLE_CLASSES or state in _UNAVAILABLE_CODES
    return False
