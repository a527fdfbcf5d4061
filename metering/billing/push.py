"""Draining the Stripe outbox: claim (committed), call Stripe (no transaction open), record.

Each customer's rows are sent one after another (Stripe allows one concurrent meter-event
call per customer and meter); different customers go in parallel threads. Retryable errors
reschedule the row with jittered exponential backoff through ``next_attempt_at`` (no long
task countdowns); a duplicate identifier means Stripe already has the event; any other 4xx
parks the row as ``dead`` with the error kept. A replayed 5xx, or a row still retrying near
the end of Stripe's 24 h idempotency window, is reconciled against Stripe (reconcile.py)
before anything is resent, then resent under a new generation of keys and identifiers.
A credit note (credit_notes.py) waits, without holding the customer's other rows, until
its invoice is finalized.
The round renews its claim on its rows while it lasts (``claims.renew``), so the
claim's lease is short and a killed pusher's customers are claimed again soon (#13 §7).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from sqlalchemy.engine import Engine

from metering.billing import claims, credit_notes, outbox, reconcile
from metering.billing.gateway import StripeGateway, Verdict, classify, replayed_server_error
from metering.billing.plan import (
    BillingPeriods,
    Carry,
    PlanInput,
    Sent,
    Step,
    plan,
    sent_identifier,
)
from metering.config import Settings
from metering.db import raw_transaction
from metering.leases import Heartbeat

log = logging.getLogger("fairmeter.stripe")
RECORD_BATCH = 50
# Customers claimed per round, per thread: enough that a thread never waits for work while
# a round lasts, few enough that other pushers find customers of their own.
CUSTOMERS_PER_THREAD = 2


@dataclass
class PushReport:
    sent_rows: int = 0
    calls: int = 0
    retried: int = 0
    dead: int = 0
    lease_lost: int = 0  # customers left because the lease was not renewed in time
    errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


class HeldRows:
    """The round's claimed rows it still renews: a customer's leave the set when its rows
    are done with, whatever their state (a row released and claimed again by another
    pusher is that pusher's to renew)."""

    def __init__(self, ids: Iterable[int]) -> None:
        self._ids = set(ids)
        self._lock = threading.Lock()

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._ids)

    def drop(self, ids: Iterable[int]) -> None:
        with self._lock:
            self._ids.difference_update(ids)


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


class Pusher:
    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        gateway_factory: Callable[[], StripeGateway] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._gateway_factory = gateway_factory or (lambda: StripeGateway(settings))
        self._local = threading.local()
        self._clock = clock
        self._rng = random.Random()
        self._meter_ready = False

    def _gateway(self) -> StripeGateway:
        if not hasattr(self._local, "gateway"):
            self._local.gateway = self._gateway_factory()
        gateway: StripeGateway = self._local.gateway
        return gateway

    def push_due(self) -> PushReport:
        """One drain: claim due rows, plan the new ones, send them, record every outcome."""
        settings = self._settings
        failure = self._ensure_meter()
        if failure is not None:
            return failure
        lease = timedelta(seconds=settings.stripe_push_lease_s)
        claimed_at = time.monotonic()
        with raw_transaction(self._engine) as conn:
            items = claims.claim(
                conn,
                self._clock(),
                settings.stripe_push_batch_size,
                lease,
                max_customers=CUSTOMERS_PER_THREAD * settings.stripe_push_threads,
            )
        if not items:
            return PushReport()
        held = HeldRows(item.id for item in items)
        with Heartbeat(
            lambda until: self._renew(held.ids(), until),
            lease,
            self._clock,
            name="stripe-push",
            written_at=claimed_at,
        ) as hold:
            return self._push_claimed(items, held, hold)

    def _push_claimed(
        self, items: list[outbox.OutboxItem], held: HeldRows, hold: Heartbeat
    ) -> PushReport:
        plans = self._make_plans([i for i in items if i.plan is None])
        by_customer: dict[tuple[str, str], list[outbox.OutboxItem]] = {}
        for item in items:
            by_customer.setdefault((item.tenant_id, item.customer_id), []).append(item)
        report = PushReport()
        with ThreadPoolExecutor(max_workers=self._settings.stripe_push_threads) as pool:
            for future in [
                pool.submit(self._push_customer, rows, plans, report, held, hold)
                for rows in by_customer.values()
            ]:
                future.result()
        return report

    def _renew(self, ids: list[int], until: datetime) -> None:
        with raw_transaction(self._engine) as conn:
            claims.renew(conn, ids, until)

    def _ensure_meter(self) -> PushReport | None:
        """Stripe refuses meter events for an event name without a meter: create it once.
        Returns the round's report when Stripe is unreachable (nothing can be sent)."""
        if self._meter_ready:
            return None
        try:
            self._gateway().meter_id(create=True)
        except Exception as exc:
            log.warning("stripe meter setup failed; will retry", extra={"error": str(exc)})
            return PushReport(errors=[f"{type(exc).__name__}: {exc}"])
        self._meter_ready = True
        return None

    def _push_customer(
        self,
        items: list[outbox.OutboxItem],
        plans: dict[int, list[Step]],
        report: PushReport,
        held: HeldRows,
        lease: Heartbeat,
    ) -> None:
        """Send one customer's rows in order. Deliveries are recorded in batches: a crash
        before a batch is written only means the calls are repeated with the same
        identifiers and idempotency keys, which Stripe answers without a second effect.

        Stops, leaving the rows claimed until the lease runs out, when the lease may have
        lapsed: another pusher may have the customer by then."""
        done: list[outbox.Delivery] = []
        try:
            for item in items:
                steps = item.plan if item.plan is not None else plans[item.id]
                if not steps:
                    with raw_transaction(self._engine) as conn:
                        outbox.finish_empty(conn, item, self._clock())
                    report.add(sent_rows=1)
                    continue
                index = item.next_step
                while index < len(steps):
                    if not lease.held():
                        log.warning("push lease not renewed; leaving the customer's rows")
                        report.add(lease_lost=1)
                        return
                    sent_step = replace(
                        steps[index],
                        identifier=sent_identifier(steps[index].identifier, item.generation),
                    )
                    outcome = self._send_step(item, index, sent_step, done, report=report)
                    if outcome == RESEND:
                        # Planned again from what Stripe has, under a new generation: the old
                        # plan may date the resend into a period finalized meanwhile.
                        self._record(done)
                        with raw_transaction(self._engine) as conn:
                            unit = self._settings.stripe_meter_unit_micros
                            outbox.replan(conn, [item.id], unit)
                        self._defer_rest(item, items)
                        return
                    if outcome is None:  # retry later; keep the customer's order
                        self._defer_rest(item, items)
                        return
                    if not isinstance(outcome, Done):
                        break  # dead, or waiting for an invoice: later rows still go
                    last = index == len(steps) - 1
                    done.append(self._delivery(item, index, sent_step, outcome, last))
                    if len(done) >= RECORD_BATCH:
                        self._record(done)
                    index += 1
                else:
                    report.add(sent_rows=1)
        finally:
            self._record(done)
            held.drop(item.id for item in items)

    @staticmethod
    def _delivery(
        item: outbox.OutboxItem, index: int, step: Step, outcome: Done, last: bool
    ) -> outbox.Delivery:
        return outbox.Delivery(
            item,
            index,
            step,
            outcome.received_at,
            outcome.note,
            last,
            outcome.invoice_id,
            outcome.currency,
            outcome.amount_minor,
        )

    def _defer_rest(self, failed: outbox.OutboxItem, items: list[outbox.OutboxItem]) -> None:
        """The customer's rows after ``failed`` wait for its next attempt, unclaimed: left
        claimed, they would hold the whole customer back for a full push lease."""
        rest = [i.id for i in items if i.id > failed.id]
        if rest:
            with raw_transaction(self._engine) as conn:
                outbox.defer_behind(conn, failed.id, rest)

    def _record(self, done: list[outbox.Delivery]) -> None:
        if not done:
            return
        with raw_transaction(self._engine) as conn:
            outbox.record_deliveries(conn, done, self._clock())
        done.clear()

    def _make_plans(self, items: list[outbox.OutboxItem]) -> dict[int, list[Step]]:
        """Plans for the round's unplanned rows, persisted (with the carries) in one
        transaction before any call, so a retry sends exactly the same requests. Carries
        are read and locked once, planned through in row order (so each customer's rows
        in order), and written back once."""
        if not items:
            return {}
        now, settings = self._clock(), self._settings
        plans: list[tuple[outbox.OutboxItem, list[Step]]] = []
        with raw_transaction(self._engine) as conn:
            sent = outbox.load_sent_for_runs(conn, [i.run_id for i in items])
            carries = outbox.lock_carries(conn, [outbox.carry_key(i) for i in items])
            periods = outbox.billing_periods(
                conn,
                [i.stripe_customer_id for i in items],
                timedelta(seconds=settings.stripe_finalization_grace_s),
                timedelta(seconds=settings.stripe_period_close_margin_s),
            )
            for item in items:
                key = outbox.carry_key(item)
                steps, carries[key] = plan(
                    self._plan_input(
                        item, sent, carries[key], now, periods[item.stripe_customer_id]
                    )
                )
                plans.append((item, steps))
            outbox.save_plans(conn, plans, carries)
        return {item.id: steps for item, steps in plans}

    def _plan_input(
        self,
        item: outbox.OutboxItem,
        sent: dict[int, list[Sent]],
        carry: Carry,
        now: datetime,
        periods: BillingPeriods,
    ) -> PlanInput:
        settings = self._settings
        return PlanInput(
            run_id=item.run_id,
            version=item.version,
            target_micros=item.target_micros,
            sent=sent.get(item.run_id, []),
            now=now,
            carry=carry,
            event_time=item.event_timestamp,
            unit_micros=settings.stripe_meter_unit_micros,
            cancel_window=timedelta(seconds=settings.stripe_cancel_window_s),
            negative_values_allowed=settings.stripe_allow_negative_meter_values,
            periods=periods,
        )

    def _send_step(
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
            return self._reconcile(item, step, done, report, "idempotency window ending")
        key = f"fairmeter:{item.id}:{index}:{step.identifier}"
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
                if verdict is Verdict.DELIVERED:
                    # Stripe had it already; treat it as old so it is never cancelled later.
                    return Done(self._clock() - timedelta(days=2), "duplicate identifier")
                if replayed_server_error(exc) and step.kind != "credit_note":
                    return self._reconcile(item, step, done, report, "replayed 5xx")
                if verdict is Verdict.DEAD or quick_retry == settings.stripe_quick_retries:
                    self._failed(item, exc, verdict, report)
                    return False if verdict is Verdict.DEAD else None
                # A blip: retry this call shortly, in place (same key, same parameters);
                # longer outages go through next_attempt_at instead.
                report.add(retried=1)
                time.sleep(backoff(quick_retry, settings, self._rng).total_seconds())
        return None

    def _window_spent(self, item: outbox.OutboxItem) -> bool:
        """Whether the row's keys are about to outlive Stripe's idempotency window."""
        if item.first_attempt_at is None:
            return False
        settings = self._settings
        limit = settings.stripe_idempotency_window_s - settings.stripe_idempotency_margin_s
        return self._clock() - item.first_attempt_at >= timedelta(seconds=limit)

    def _reconcile(
        self,
        item: outbox.OutboxItem,
        step: Step,
        done: list[outbox.Delivery],
        report: PushReport,
        why: str,
    ) -> Outcome:
        """Ask Stripe's summaries whether the step landed: record it, resend it under a new
        generation, or retry later when the summaries cannot tell yet."""
        now = self._clock()
        if step.kind == "meter_event" and step.units == 0:
            return Done(now, "less than one meter unit: carried")
        first = item.first_attempt_at or now
        if now - first < timedelta(seconds=self._settings.stripe_summary_lag_s):
            self._later(item, f"{why}: waiting for Stripe's summaries to settle")
            report.add(retried=1)
            return None
        self._record(done)  # our side of the hour must include every earlier call
        with raw_transaction(self._engine) as conn:
            hour, ours = reconcile.our_hour(conn, item.tenant_id, item.customer_id, step)
        try:
            landed, delta = reconcile.meter_call_landed(
                self._gateway(), item.stripe_customer_id, step, hour, ours
            )
        except Exception as exc:
            self._failed(item, exc, Verdict.RETRY, report)
            return None
        log.warning(
            "stripe call reconciled",
            extra={"outbox_id": item.id, "why": why, "landed": landed.value, "delta": delta},
        )
        if landed is reconcile.Landed.YES:
            return Done(first, f"{why}: reconciled, landed")
        if landed is reconcile.Landed.NO:
            return RESEND
        self._later(item, f"{why}: summaries differ by {delta} units in {hour.isoformat()}")
        report.add(retried=1)
        return None

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
        issued = credit_notes.issue(self._gateway(), self._settings, item, step, key, now)
        return Done(now, issued.note_id, issued.invoice_id, issued.currency, issued.amount_minor)

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
