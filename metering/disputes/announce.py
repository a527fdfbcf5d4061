"""What support's actions tell the tenant: ``dispute.opened``, ``credit.granted``,
``run.released`` and ``dispute.resolved``, recorded in the action's transaction.

An action that re-settles the run records its own notification first, so per run the order
is the action, then the ``run.resettled`` and ``run.status_changed`` settlement records for
it; a dispute's resolution comes after the credit that approves it.
"""

from __future__ import annotations

from typing import Any

import psycopg

from metering.keys import Principal
from metering.notifications import record
from metering.notifications.builders import RunRef, about_run
from metering.notifications.catalogue import (
    CREDIT_GRANTED,
    DISPUTE_OPENED,
    DISPUTE_RESOLVED,
    RUN_RELEASED,
)


def run_ref(principal: Principal, run_id: int, subject: str, customer_id: str) -> RunRef:
    """The run of a support action: always in the acting key's own tenant."""
    return RunRef(principal.tenant_id, customer_id, run_id, subject)


def dispute_opened(
    conn: psycopg.Connection[Any], run: RunRef, principal: Principal, dispute_id: int, claim: str
) -> None:
    record(
        conn, about_run(run, DISPUTE_OPENED, dispute=dispute_id, claim=claim, by=principal.key_id)
    )


def credit_granted(
    conn: psycopg.Connection[Any],
    run: RunRef,
    principal: Principal,
    amount_micros: int,
    reason: str,
    dispute_id: int | None,
) -> None:
    record(
        conn,
        about_run(
            run,
            CREDIT_GRANTED,
            amount_micros=amount_micros,
            reason=reason,
            by=principal.key_id,
            dispute=dispute_id,
        ),
    )


def run_released(
    conn: psycopg.Connection[Any], run: RunRef, principal: Principal, held_micros: int, reason: str
) -> None:
    record(
        conn,
        about_run(run, RUN_RELEASED, held_micros=held_micros, reason=reason, by=principal.key_id),
    )


def dispute_resolved(
    conn: psycopg.Connection[Any],
    run: RunRef,
    principal: Principal,
    dispute_id: int,
    *,
    resolution: str,
    credit_micros: int,
    reason: str,
) -> None:
    record(
        conn,
        about_run(
            run,
            DISPUTE_RESOLVED,
            dispute=dispute_id,
            resolution=resolution,
            credit_micros=credit_micros,
            reason=reason,
            by=principal.key_id,
        ),
    )
