"""Notifications: what a tenant is told happened to its runs, recorded with the change.

One row per fact (``record``), written inside the transaction that makes the change, so a
rolled-back change tells nobody and a committed one is never lost. Two readers:

* outbound webhooks fan each row out to the tenant's endpoints (``metering.webhooks``);
* the live status stream replays rows after a ``Last-Event-ID`` and is woken by the
  ``pg_notify`` that ``record`` sends, which PostgreSQL delivers only when the transaction
  commits, to every API process listening, whichever worker made the change.
"""

from metering.notifications.catalogue import CHANNEL, EVENT_TYPES, SCHEMA_VERSION
from metering.notifications.record import Notification, record, record_many

__all__ = ["CHANNEL", "EVENT_TYPES", "SCHEMA_VERSION", "Notification", "record", "record_many"]
