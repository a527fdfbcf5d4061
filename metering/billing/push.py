"""Draining the Stripe outbox: claim (committed), call Stripe (no transaction open), record.

Each customer's rows are sent one after another (Stripe allows one concurrent meter-event
call per customer and meter); different customers go in parallel threads. Retryable errors
reschedule the row with jittered exponential backoff through ``next_attempt_at`` (no long
task countdowns); a duplicate identifier means Stripe already has the event; any other 4xx
parks the row as ``dead`` with the error kept. A replayed 5xx is answered by a probe: the
same identifier under a fresh key, which Stripe refuses as a duplicate if the first attempt
landed. A row still retrying at the end of Stripe's 24 h idempotency window sends nothing
more; once Stripe's summaries can be trusted it is reconciled (reconcile.py), and only a
proof that nothing landed resends it, under a new generation of keys and identifiers.
A credit note (credit_notes.py) waits, without holding the customer's other rows, until
its invoice is finalized.
Sending a step and judging its outcome live in step_sender.py, planning a round's new rows
in push_plans.py, the round's report and renewed claims in push_round.py.
A round leases each customer it claims and holds the lease until every result of that
customer's calls is recorded (``claims``): one sender per customer from planning to record,
so a correction is planned against what is in flight (#29). It renews the leases and its
claim on its rows while it lasts (``claims.renew``), so the lease is short and a killed
pusher's customers are claimed again soon (#13 §7).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy.engine import Engine

from metering.billing import claims, outbox
from metering.billing.gateway import StripeGateway
from metering.billing.plan import Step, sent_identifier
from metering.billing.push_plans import Planner
from metering.billing.push_round import HeldRows, PushReport
from metering.billing.step_sender import RESEND, Done, StepSender
from metering.config import Settings
from metering.db import raw_transaction
from metering.leases import Heartbeat

__all__ = ["PushReport", "Pusher"]

log = logging.getLogger("fairmeter.stripe")
RECORD_BATCH = 50
# Customers claimed per round, per thread: enough that a thread never waits for work while
# a round lasts, few enough that other pushers find customers of their own.
CUSTOMERS_PER_THREAD = 2


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
        self._planner = Planner(engine, settings, clock)
        self._sender = StepSender(engine, settings, self._gateway, clock, self._rng)

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
        claimed_at, holder = time.monotonic(), uuid.uuid4().hex
        with raw_transaction(self._engine) as conn:
            items = claims.claim(
                conn,
                self._clock(),
                settings.stripe_push_batch_size,
                lease,
                max_customers=CUSTOMERS_PER_THREAD * settings.stripe_push_threads,
                holder=holder,
            )
        if not items:
            return PushReport()
        held = HeldRows(holder, ((i.id, i.tenant_id, i.customer_id) for i in items))
        with Heartbeat(
            lambda until: self._renew(held, until),
            lease,
            self._clock,
            name="stripe-push",
            written_at=claimed_at,
        ) as hold:
            return self._push_claimed(items, held, hold)

    def _push_claimed(
        self, items: list[outbox.OutboxItem], held: HeldRows, hold: Heartbeat
    ) -> PushReport:
        plans = self._planner.make_plans([i for i in items if i.plan is None])
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

    def _renew(self, held: HeldRows, until: datetime) -> None:
        with raw_transaction(self._engine) as conn:
            lost = claims.renew(conn, held.holder, held.ids(), until, held.customers())
        held.lost(lost)

    def _release(self, held: HeldRows, item: outbox.OutboxItem) -> None:
        with raw_transaction(self._engine) as conn:
            claims.release(conn, held.holder, item.tenant_id, item.customer_id)

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

        Stops when the lease may have lapsed: another pusher may have the customer by then.
        The customer's lease is released only once every result is recorded (a failed
        record leaves it to lapse), so the next plan for the customer sees them all."""
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
                    if not (lease.held() and held.holds(item.tenant_id, item.customer_id)):
                        log.warning("push lease not renewed; leaving the customer's rows")
                        report.add(lease_lost=1)
                        return
                    sent_step = replace(
                        steps[index],
                        identifier=sent_identifier(steps[index].identifier, item.generation),
                    )
                    outcome = self._sender.send(item, index, sent_step, done, report=report)
                    if outcome == RESEND:
                        # Planned again from what Stripe has, under a new generation: the old
                        # plan may date the resend into a period finalized meanwhile.
                        self._sender.record(done)
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
                        self._sender.record(done)
                    index += 1
                else:
                    report.add(sent_rows=1)
        finally:
            self._sender.record(done)
            held.drop(item.id for item in items)
            self._release(held, items[0])

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
