"""Engine, sessions and the unit of work.

``unit_of_work`` is the only place that commits: the edge (a request handler's dependency,
a Celery task wrapper, a CLI command) opens one per use case.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session

from metering.config import Settings

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
