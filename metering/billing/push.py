"""Draining the Stripe outbox: claim (committed), call Stripe (no transaction open), record.

Each customer's rows are sent one after another (Stripe allows one concurrent meter-event
call per customer and meter); different customers go in parallel threads. Retryable errors
reschedule the row with jittered exponential backoff through ``next_attempt_at`` (no long
task countdowns); a duplicate identifier means Stripe already has the event; any other 4xx
parks the row as ``dead`` with the error kept. The round renews its claim on its rows while
it lasts (``claims.renew``), so the claim's lease is short and a killed pusher's customers
are claimed again soon (issue #13 §7).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy.engine import Engine

from metering.billing import claims, outbox
from metering.billing.gateway import StripeGateway, Verdict, classify
from metering.billing.plan import Carry, PlanInput, Sent, Step, plan, within_any
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
                for index in range(item.next_step, len(steps)):
                    if not lease.held():
                        log.warning("push lease not renewed; leaving the customer's rows")
                        report.add(lease_lost=1)
                        return
                    outcome = self._send_step(item, index, steps[index], report=report)
                    if outcome is None:  # retry later; keep the customer's order
                        self._defer_rest(item, items)
                        return
                    if not isinstance(outcome, tuple):
                        break  # dead: later rows of the customer still go
                    last = index == len(steps) - 1
                    done.append(outbox.Delivery(item, index, steps[index], *outcome, last))
                    if len(done) >= RECORD_BATCH:
                        self._record(done)
                else:
                    report.add(sent_rows=1)
        finally:
            self._record(done)
            held.drop(item.id for item in items)

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
            closed: dict[str, list[tuple[datetime, datetime]]] = {}
            if settings.stripe_allow_negative_meter_values:
                closed = outbox.closed_periods(conn, [i.stripe_customer_id for i in items])
            for item in items:
                key = outbox.carry_key(item)
                negative_ok = settings.stripe_allow_negative_meter_values and not within_any(
                    closed.get(item.stripe_customer_id, []), item.event_timestamp
                )
                steps, carries[key] = plan(
                    self._plan_input(item, sent, carries[key], now, negative_ok)
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
        negative_ok: bool,
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
            negative_values_allowed=negative_ok,
        )

    def _send_step(
        self, item: outbox.OutboxItem, index: int, step: Step, *, report: PushReport
    ) -> tuple[datetime, str | None] | bool | None:
        """(received_at, note) when the step took effect; None to retry later; False if dead."""
        key = f"fairmeter:{item.id}:{index}:{step.identifier}"
        for quick_retry in range(self._settings.stripe_quick_retries + 1):
            try:
                outcome = self._call(item, step, key)
                report.add(calls=1)
                return outcome
            except Exception as exc:  # classified: every SDK error maps to a verdict
                verdict = classify(exc)
                if verdict is Verdict.DELIVERED:
                    # Stripe had it already; treat it as old so it is never cancelled later.
                    return self._clock() - timedelta(days=2), "duplicate identifier: delivered"
                if verdict is Verdict.DEAD or quick_retry == self._settings.stripe_quick_retries:
                    self._failed(item, exc, verdict, report)
                    return False if verdict is Verdict.DEAD else None
                # A blip: retry this call shortly, in place (same key, same parameters);
                # longer outages go through next_attempt_at instead.
                report.add(retried=1)
                time.sleep(backoff(quick_retry, self._settings, self._rng).total_seconds())
        return None

    def _call(self, item: outbox.OutboxItem, step: Step, key: str) -> tuple[datetime, str | None]:
        gateway, now = self._gateway(), self._clock()
        if step.kind == "meter_event":
            if step.units == 0:
                return now, "less than one meter unit: carried"
            received = gateway.send_meter_event(
                identifier=step.identifier,
                customer=item.stripe_customer_id,
                value=step.units,
                timestamp=datetime.fromtimestamp(step.timestamp, UTC),
                key=key,
            )
            return received, None
        if step.kind == "meter_cancel":
            assert step.cancels_identifier is not None
            gateway.cancel_meter_event(identifier=step.cancels_identifier, key=key)
            return now, None
        if step.cents == 0:
            return now, "less than one cent: carried"
        gateway.credit_balance(
            customer=item.stripe_customer_id,
            cents=step.cents,
            key=key,
            description=f"Fairmeter correction for run {item.run_id} (v{item.version})",
            metadata={"run_id": str(item.run_id), "decision_version": str(item.version)},
        )
        return now, None

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
