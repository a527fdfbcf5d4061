"""The Fairmeter client for agent backends: report runs as CloudEvents, never lose one.

Install-side dependencies: the standard library, ``httpx`` and ``standardwebhooks`` only (no
server code)::

    from fairmeter_client import Meter

    meter = Meter(base_url, api_key, source="agent-backend/eu-1", spool_path="fairmeter.db")
    with meter.run("run-42", customer="cust-7") as run:
        run.started()
        run.usage(step=1, model="agent-large-1", input_tokens=1200, output_tokens=300)
        run.delivered(step=1, kind="final")
        run.completed()
    meter.close()  # flushes for up to 10 s; the rest waits in the spool for the next start

Every call writes its event to a local SQLite spool (fsynced) before it returns; a
background thread sends the spool in order, in batches, and retries until the server has
committed each event. Ids are stable (:mod:`fairmeter_client.ids`), so a repeated call or a
resent batch never counts twice. Events the server refuses end up in
``meter.dead_letters()`` with the server's problem details. See ``README.md`` here.

``follow_run(base_url, key, run)`` (and ``follow_customer``) iterate over a run's status as
it changes, reconnecting with ``Last-Event-ID`` after any drop (:mod:`fairmeter_client.follow`).

A receiver of Fairmeter's webhooks verifies them with :func:`fairmeter_client.webhooks.verify`.
"""

from fairmeter_client.errors import (
    EventConflictError,
    MeterConfigError,
    MeterError,
    SpoolFullError,
    SpoolLockedError,
    StreamRefusedError,
)
from fairmeter_client.follow import StatusEvent, follow_customer, follow_run
from fairmeter_client.ids import event_id
from fairmeter_client.meter import Meter, MeterStats
from fairmeter_client.run import Run
from fairmeter_client.spool import DeadLetter

__all__ = [
    "DeadLetter",
    "EventConflictError",
    "Meter",
    "MeterConfigError",
    "MeterError",
    "MeterStats",
    "Run",
    "SpoolFullError",
    "SpoolLockedError",
    "StatusEvent",
    "StreamRefusedError",
    "event_id",
    "follow_customer",
    "follow_run",
]
