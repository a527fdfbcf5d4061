"""Meter events Stripe accepted, then rejected: the error reports, and what each code means.

Stripe's v1 meter-event endpoint answers 200 and validates later; failures come back as a
``v1.billing.meter.error_report_triggered`` thin event (``v1.billing.meter.no_meter_found``
when no meter has the event name) covering a validation window, with a count per error code
and a few sample requests. A rejected event never reaches the summaries or the invoice, so
its delivery is recorded as having no effect (a ``meter_rejected`` delivery that takes its
micros back out), and the run's latest row is either planned again or dead-lettered:

* ``timestamp_too_far_in_past`` / ``timestamp_in_future``: planned again at once; the
  planner dates the resend inside Stripe's window and in an open period.
* every other code (the customer, the meter, the value): dead-lettered with the code; fix
  the cause, then ``fairmeter stripe dead --retry``, which plans the row again.

Samples are capped, so the caller also compares what was sent in the window with Stripe's
summaries (``service.unsampled_rejections``) and passes the identifiers that shows rejected.

A report can arrive while a pusher is still sending the very row it names: the rejected
call returned 200 but is not recorded yet, or later steps of the row are in flight. Applying
it then would drop the rejection (no delivery to mark) or re-plan a row under a pusher that
goes on recording the old plan. So the report is applied only under the lock of every row
it touches, with no live pusher holding the lease of their customers (``claims``: held from
planning until every result is recorded, whatever the rows' status) and every named event
of ours recorded; otherwise it stays in the inbox and is handled on a later pass
(``in_flight``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from metering.billing import carries, outbox
from metering.billing.plan import period_label

log = logging.getLogger("fairmeter.stripe")

REPLAN_CODES = frozenset({"timestamp_too_far_in_past", "timestamp_in_future"})
OUTCOMES = {
    "no_meter": "dead: create the meter for the event name, then retry the dead rows",
    "archived_meter": "dead: reactivate (or recreate) the meter, then retry the dead rows",
    "meter_event_customer_not_found": "dead: link the right Stripe customer, then retry",
    "meter_event_no_customer_defined": "dead: link the customer to Stripe, then retry",
    "meter_event_invalid_value": "dead: a bug on our side; fix it, then retry",
    "timestamp_too_far_in_past": "planned again at once, dated inside Stripe's window",
    "timestamp_in_future": "planned again at once, dated now",
}


def counts_by_code(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Meter events Stripe accepted and later rejected, by error code (the metric's source:
    a send that looked fine must not hide in a "sent" count)."""
    rows = conn.execute(
        "SELECT split_part(note, ' ', 1), count(*) FROM stripe_deliveries "
        "WHERE kind = 'meter_rejected' GROUP BY 1"
    ).fetchall()
    return {str(code): int(count) for code, count in rows}


def sampled_errors(event: dict[str, Any]) -> list[tuple[str, str]]:
    """(meter identifier, error code) for each sample in a report's full ``data``."""
    reason = (event.get("data") or {}).get("reason") or {}
    found = []
    for error_type in reason.get("error_types") or []:
        for sample in error_type.get("sample_errors") or []:
            identifier = (sample.get("request") or {}).get("identifier")
            if isinstance(identifier, str):
                found.append((meter_identifier(identifier), str(error_type.get("code"))))
    return found


def error_counts(event: dict[str, Any]) -> dict[str, int]:
    reason = (event.get("data") or {}).get("reason") or {}
    return {
        str(t.get("code")): int(t.get("error_count") or 0) for t in reason.get("error_types") or []
    }


def validation_window(event: dict[str, Any]) -> tuple[datetime, datetime] | None:
    data = event.get("data") or {}
    start, end = data.get("validation_start"), data.get("validation_end")
    if not isinstance(start, str) or not isinstance(end, str):
        return None
    return _parse_time(start), _parse_time(end)


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def meter_identifier(reported: str) -> str:
    """Stripe reports the request's idempotency key there; ours embed the meter identifier
    (``fairmeter:<row>:<step>:<identifier>``), so both forms lead to the delivery."""
    if reported.startswith("fairmeter:"):
        parts = reported.split(":", 3)
        if len(parts) == 4:
            return parts[3]
    return reported


_OUR_IDENTIFIER = re.compile(r"run:(\d+):v\d+(?::g\d+)?")


def in_flight(
    conn: psycopg.Connection[Any], event: dict[str, Any], unsampled: Sequence[str], now: datetime
) -> str | None:
    """Why the report must wait for a pusher (None when it can be applied now): a live
    pusher holds the lease of a customer whose runs it names, or an event of ours it names
    is not recorded. Locks the pending outbox rows of those runs until the caller's
    transaction ends, so no pusher can claim them between this check and the report's
    writes (a claim re-checks the status)."""
    identifiers = {identifier for identifier, _ in sampled_errors(event)} | set(unsampled)
    runs = sorted(
        {int(m.group(1)) for i in identifiers if (m := _OUR_IDENTIFIER.fullmatch(i)) is not None}
    )
    if not runs:
        return None
    rows = conn.execute(
        "SELECT id FROM stripe_outbox WHERE run_id = ANY(%s) "
        "AND status = 'pending' ORDER BY id FOR UPDATE",
        (runs,),
    ).fetchall()
    held = conn.execute(
        "SELECT DISTINCT l.customer_id FROM stripe_customer_leases l JOIN stripe_outbox o "
        "ON o.tenant_id = l.tenant_id AND o.customer_id = l.customer_id "
        "WHERE o.run_id = ANY(%s) AND l.held_until > %s ORDER BY 1",
        (runs, now),
    ).fetchall()
    if held:
        return f"customers {[c for (c,) in held]} are being sent to by a pusher"
    recorded = {
        r[0]
        for r in conn.execute(
            "SELECT identifier FROM stripe_deliveries WHERE kind = 'meter_event' "
            "AND identifier = ANY(%s)",
            (sorted(identifiers),),
        ).fetchall()
    }
    unrecorded = sorted(
        i for i in identifiers if i not in recorded and _OUR_IDENTIFIER.fullmatch(i) is not None
    )
    if unrecorded and rows:  # a pending row will still record (or resend) them
        return f"{unrecorded[:3]} accepted by Stripe but not recorded yet"
    return None


def handle_report(
    conn: psycopg.Connection[Any], event: dict[str, Any], unsampled: Sequence[str], unit: int
) -> None:
    """Record every rejected delivery as no effect; plan again or dead-letter its run."""
    errors = dict(sampled_errors(event))
    codes = set(error_counts(event)) | set(errors.values())
    if codes and codes <= REPLAN_CODES:
        fallback = sorted(codes)[0]
    else:
        fallback = "unsampled:" + ",".join(sorted(codes - REPLAN_CODES) or ["unknown"])
    for identifier in unsampled:
        errors.setdefault(identifier, fallback)
    replan: set[int] = set()
    dead: dict[int, str] = {}
    for identifier, code in errors.items():
        row = _reject(conn, identifier, code, event["id"], unit)
        if row is None:
            continue
        if code in REPLAN_CODES:
            replan.add(row)
        else:
            dead[row] = f"Stripe rejected {identifier}: {code} (report {event['id']})"
    outbox.replan(conn, sorted(replan - set(dead)), unit)
    for row_id, error in dead.items():
        conn.execute(
            "UPDATE stripe_outbox SET status = 'dead', claimed_until = NULL, last_error = %s "
            "WHERE id = %s",
            (error, row_id),
        )
    log.error(
        "stripe meter error report",
        extra={"event_id": event["id"], "rejected": len(errors), "codes": sorted(codes)},
    )


def _reject(
    conn: psycopg.Connection[Any], identifier: str, code: str, event_id: str, unit: int
) -> int | None:
    """Record the delivery ``identifier`` as rejected (once); the run's latest outbox row."""
    # The rejection's key goes to stripe_delivery_keys first (migration 0024): Stripe's
    # webhook about it may come again in another transaction, or another month.
    row = conn.execute(
        """
        WITH sent AS (
            SELECT * FROM stripe_deliveries
            WHERE kind = 'meter_event' AND identifier = %(identifier)s
        ),
        fresh AS (
            INSERT INTO stripe_delivery_keys (tenant_id, kind, identifier)
            SELECT tenant_id, 'meter_rejected', 'rejected:' || identifier FROM sent
            ON CONFLICT DO NOTHING
            RETURNING tenant_id
        )
        INSERT INTO stripe_deliveries (outbox_id, tenant_id, customer_id, run_id, kind,
            identifier, cancels_identifier, micros, units, cents, event_timestamp,
            stripe_received_at, note)
        SELECT outbox_id, s.tenant_id, customer_id, run_id, 'meter_rejected',
               'rejected:' || identifier, identifier, -micros, units, 0, event_timestamp,
               %(now)s, %(note)s
        FROM sent s JOIN fresh f ON f.tenant_id = s.tenant_id
        RETURNING run_id, tenant_id, customer_id, micros, units, event_timestamp
        """,
        {"now": datetime.now(UTC), "note": f"{code} ({event_id})"[:200], "identifier": identifier},
    ).fetchone()
    if row is None:
        return None  # not ours, or already recorded
    run_id, tenant, customer, micros, units, stamp = row
    latest = conn.execute(
        "SELECT id FROM stripe_outbox WHERE run_id = %s AND status <> 'superseded' "
        "ORDER BY decision_version DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    assert latest is not None, "a delivery belongs to an outbox row"
    # Σ units × unit + carry = Σ micros must hold without the rejected event, in the carry
    # of the period the event was dated in (where its units would have landed).
    carries.add(conn, tenant, customer, {period_label(stamp): units * unit + micros})
    return int(latest[0])
