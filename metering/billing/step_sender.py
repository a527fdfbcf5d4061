"""Sending one planned step to Stripe and deciding what its outcome means for the row.

Split from the pusher (push.py), which walks each customer's rows in order: this module
makes the call (same key and parameters on every retry), retries a blip in place, parks a
dead row, waits for a credit note's invoice, probes a replayed 5xx (the same identifier under
a fresh key), and past the idempotency window reconciles against Stripe's summaries
(reconcile.py) once they can be trusted.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy.engine import Engine

from metering.billing import credit_notes, outbox, reconcile
from metering.billing.gateway import (
    StripeGateway,
    Verdict,
    already_cancelled,
    classify,
    replayed_server_error,
)
from metering.billing.plan import Step
from metering.billing.push_round import PushReport
from metering.config import Settings
from metering.db import raw_transaction

log = logging.getLogger("fairmeter.stripe")


@dataclass(frozen=True, slots=True)
class Done:
    """A step that took effect (or needed no call)."""

    received_at: datetime
    note: str | None = None
    invoice_id: str | None = None
    currency: str | None = None
    amount_minor: int | None = None


WAIT = "wait"  # the row waits; the customer's later rows go on
RESEND = "resend"  # reconciled as not landed: plan the row again under a new generation
Outcome = Done | bool | str | None


def backoff(attempts: int, settings: Settings, rng: random.Random) -> timedelta:
    """Full-jitter exponential backoff, capped."""
    ceiling = min(settings.stripe_backoff_max_s, settings.stripe_backoff_base_s * 2**attempts)
    return timedelta(seconds=rng.uniform(ceiling / 2, ceiling))


class StepSender:
    """Calls Stripe for one step at a time and records outcomes, for one pusher."""

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        gateway: Callable[[], StripeGateway],
        clock: Callable[[], datetime],
        rng: random.Random,
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._gateway = gateway
        self._clock = clock
        self._rng = rng

    def record(self, done: list[outbox.Delivery]) -> None:
        """Write the deliveries done so far and move their rows on (one transaction)."""
        if not done:
            return
        with raw_transaction(self._engine) as conn:
            outbox.record_deliveries(conn, done, self._clock())
        done.clear()

    def send(
        self,
        item: outbox.OutboxItem,
        index: int,
        step: Step,
        done: list[outbox.Delivery],
        *,
        report: PushReport,
    ) -> Outcome:
        """Done when the step took effect; None to retry later; False if dead; WAIT when
        its invoice is not final yet; RESEND when reconciled as not landed."""
        settings = self._settings
        if step.kind != "credit_note" and self._window_spent(item):
            return self._reconcile(item, step, done, report)
        key = base_key = f"fairmeter:{item.id}:{index}:{step.identifier}"
        if step.kind == "credit_note":
            self.record(done)  # its amount depends on every earlier note being recorded
        for quick_retry in range(settings.stripe_quick_retries + 1):
            try:
                outcome = self._call(item, step, key)
                report.add(calls=1)
                return outcome
            except credit_notes.InvoiceNotFinal as exc:
                self._wait(item, str(exc))
                return WAIT
            except credit_notes.NoInvoice as exc:
                self._failed(item, exc, Verdict.DEAD, report)
                return False
            except Exception as exc:  # classified: every SDK error maps to a verdict
                verdict = classify(exc)
                if verdict is Verdict.DELIVERED or (key != base_key and already_cancelled(exc)):
                    # Stripe had it already; treat it as old so it is never cancelled later.
                    return Done(self._clock() - timedelta(days=2), "duplicate identifier")
                last = quick_retry == settings.stripe_quick_retries
                if replayed_server_error(exc) and step.kind != "credit_note" and not last:
                    key = self._probe_key(item, base_key, quick_retry, exc)
                    report.add(retried=1)
                    continue
                if verdict is Verdict.DEAD or last:
                    self._failed(item, exc, verdict, report)
                    return False if verdict is Verdict.DEAD else None
                # A blip: retry this call shortly, in place (same key, same parameters);
                # longer outages go through next_attempt_at instead.
                report.add(retried=1)
                time.sleep(backoff(quick_retry, settings, self._rng).total_seconds())
        return None

    def _probe_key(
        self, item: outbox.OutboxItem, base_key: str, quick_retry: int, exc: Exception
    ) -> str:
        """A fresh idempotency key for the same step and identifier: Stripe replays the
        stored 5xx to the old key forever, but refuses the identifier as a duplicate if the
        first attempt landed, or takes the event (or cancel) now if it did not. Billed once
        either way while the identifier is unique (``_window_spent`` ends probing in time);
        a cancel cannot take effect twice. The row's attempts make each round's keys new."""
        key = f"{base_key}:probe{item.attempts}.{quick_retry}"
        log.warning(
            "stripe replayed a 5xx; probing with the same identifier",
            extra={"outbox_id": item.id, "key": key, "error": str(exc)},
        )
        return key

    def _window_spent(self, item: outbox.OutboxItem) -> bool:
        """Whether the row's keys and identifiers are about to outlive Stripe's window."""
        if item.first_attempt_at is None:
            return False
        return self._clock() >= reconcile.sending_ends_at(item.first_attempt_at, self._settings)

    def _reconcile(
        self,
        item: outbox.OutboxItem,
        step: Step,
        done: list[outbox.Delivery],
        report: PushReport,
    ) -> Outcome:
        """Past the sending window: nothing more is sent. Once summaries can be trusted, the
        step is recorded as landed or resent under a new generation; until then, or while
        the hour's summary explains neither, the row waits and raises an alarm."""
        now = self._clock()
        if step.kind == "meter_event" and step.units == 0:
            return Done(now, "less than one meter unit: carried")
        first = item.first_attempt_at or now
        self.record(done)  # our side of the hour must include every earlier call
        with raw_transaction(self._engine) as conn:
            hour, ours = reconcile.our_hour(conn, item.tenant_id, item.customer_id, step)
        trusted_at = reconcile.trusted_at(first, self._settings)
        if now < trusted_at:
            self._await(item, hour, f"summaries trusted from {trusted_at.isoformat()}", report)
            return None
        try:
            landed, delta = reconcile.meter_call_landed(
                self._gateway(), item.stripe_customer_id, step, hour, ours
            )
        except Exception as exc:
            self._failed(item, exc, Verdict.RETRY, report)
            return None
        log.warning(
            "stripe call reconciled",
            extra={"outbox_id": item.id, "landed": landed.value, "delta": delta},
        )
        if landed is reconcile.Landed.YES:
            return Done(first, "idempotency window ended: reconciled, landed")
        if landed is reconcile.Landed.NO:
            return RESEND
        self._await(item, hour, f"summary differs by {delta} units", report)
        return None

    def _await(self, item: outbox.OutboxItem, hour: datetime, why: str, report: PushReport) -> None:
        """The row waits for reconciliation, loudly: an operator may have to look."""
        log.error(
            "stripe row awaiting reconciliation",
            extra={
                "outbox_id": item.id,
                "customer": item.customer_id,
                "hour": hour.isoformat(),
                "why": why,
            },
        )
        self._later(item, f"{reconcile.AWAITING}: {why} (hour {hour.isoformat()})")
        report.add(retried=1)

    def _call(self, item: outbox.OutboxItem, step: Step, key: str) -> Done:
        gateway, now = self._gateway(), self._clock()
        if step.kind == "credit_note":
            return self._credit_note(item, step, key)
        if step.kind == "meter_event":
            if step.units == 0:
                return Done(now, "less than one meter unit: carried")
            received = gateway.send_meter_event(
                identifier=step.identifier,
                customer=item.stripe_customer_id,
                value=step.units,
                timestamp=datetime.fromtimestamp(step.timestamp, UTC),
                key=key,
            )
            return Done(received)
        if step.kind == "meter_cancel":
            assert step.cancels_identifier is not None
            gateway.cancel_meter_event(identifier=step.cancels_identifier, key=key)
            return Done(now)
        raise ValueError(f"no longer planned: {step.kind}")  # legacy balance credits

    def _credit_note(self, item: outbox.OutboxItem, step: Step, key: str) -> Done:
        now = self._clock()
        if step.units == 0:
            return Done(now, "less than one meter unit: carried")
        issued = credit_notes.issue(
            self._gateway(),
            self._settings,
            item,
            step,
            key,
            now,
            self._credited(item),
            look_first=self._window_spent(item),
        )
        note = issued.note_id or "below one minor unit: credited with a later note"
        return Done(now, note, issued.invoice_id, issued.currency, issued.amount_minor)

    def _credited(self, item: outbox.OutboxItem) -> Callable[[str], credit_notes.Credited]:
        def credited_on(invoice_id: str) -> credit_notes.Credited:
            with raw_transaction(self._engine) as conn:
                units, minor = outbox.credited_on_invoice(conn, item.tenant_id, invoice_id)
            return credit_notes.Credited(units, minor)

        return credited_on

    def _wait(self, item: outbox.OutboxItem, why: str) -> None:
        at = self._clock() + timedelta(seconds=self._settings.stripe_backoff_max_s)
        with raw_transaction(self._engine) as conn:
            outbox.retry_later(conn, item, why, at)

    def _later(self, item: outbox.OutboxItem, why: str) -> None:
        at = self._clock() + backoff(item.attempts, self._settings, self._rng)
        with raw_transaction(self._engine) as conn:
            outbox.retry_later(conn, item, why, at)

    def _failed(
        self, item: outbox.OutboxItem, exc: Exception, verdict: Verdict, report: PushReport
    ) -> bool:
        error = f"{type(exc).__name__}: {exc}"
        with raw_transaction(self._engine) as conn:
            if verdict is Verdict.DEAD:
                outbox.mark_dead(conn, item, error)
            else:
                at = self._clock() + backoff(item.attempts, self._settings, self._rng)
                outbox.retry_later(conn, item, error, at)
        if verdict is Verdict.DEAD:
            log.error("stripe row dead", extra={"outbox_id": item.id, "error": error})
            report.add(dead=1)
            return True  # a dead row does not block the customer's later rows
        report.add(retried=1)
        return False
