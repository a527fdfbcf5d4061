"""Notifications as each change point builds them: the fields every payload carries, once.

Every payload's ``data`` starts with ``schema_version`` and, when it is about a run, the
run's public id and its customer, so a receiver never has to look anything up to know
whose change it is. Each type's own fields are listed in docs/events.md, "Notifications".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from metering.notifications.catalogue import RUN_STATUS_CHANGED, SCHEMA_VERSION
from metering.notifications.record import Notification
from metering.timestamps import canonical_time


@dataclass(frozen=True, slots=True)
class RunRef:
    """Whose run a notification is about: the tenant and customer it is recorded for."""

    tenant_id: str
    customer_id: str
    run_id: int
    subject: str


def about_run(run: RunRef, type_: str, **fields: Any) -> Notification:
    """A notification about ``run`` with the type's own ``fields``."""
    data = {"schema_version": SCHEMA_VERSION, "run": run.subject, "customer": run.customer_id}
    return Notification(
        run.tenant_id,
        run.customer_id,
        type_,
        data | fields,
        run_id=run.run_id,
        subject=run.subject,
    )


def about_customer(tenant_id: str, customer_id: str, type_: str, **fields: Any) -> Notification:
    """A notification about a customer as a whole (a statement), not one run."""
    data = {"schema_version": SCHEMA_VERSION, "customer": customer_id}
    return Notification(tenant_id, customer_id, type_, data | fields)


def status_changed(
    run: RunRef, status: str, previous: str | None, changed_at: datetime
) -> Notification:
    """``run.status_changed``: the words a user sees went from ``previous`` (None: never
    announced before) to ``status``."""
    return about_run(
        run,
        RUN_STATUS_CHANGED,
        status=status,
        previous_status=previous,
        changed_at=timestamp(changed_at),
    )


def timestamp(moment: datetime) -> str:
    """Times in payloads: RFC 3339 in UTC, as the event catalogue writes them."""
    return canonical_time(moment)
