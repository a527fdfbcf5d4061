"""Draining the Stripe outbox: claim (committed), call Stripe (no transaction open), record.

Each customer's rows are sent one after another (Stripe allows one concurrent meter-event
call per customer and meter); different customers go in parallel threads. Retryable errors
reschedule the row with jittered exponential backoff through ``next_attempt_at`` (no long
task countdowns); a duplicate identifier means Stripe already has the event; any other 4xx
parks the row as ``dead`` with the error kept.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy.engine import Engine

from metering.billing import outbox
from metering.billing.gateway import StripeGateway, Verdict, classify
from metering.billing.plan import PlanInput, Step, plan
from metering.config import Settings
from metering.db import raw_transaction

log = logging.getLogger("fairmeter.stripe")


@dataclass
class PushReport:
    sent_rows: int = 0
    calls: int = 0
    retried: int = 0
    dead: int = 0
    errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


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
        """One drain: claim due rows, send them, record every outcome."""
        settings = self._settings
        if not self._meter_ready:
            # Stripe refuses meter events for an event name without a meter: create it once.
            try:
                self._gateway().meter_id(create=True)
            except Exception as exc:  # Stripe unreachable: nothing can be sent this round
                log.warning("stripe meter setup failed; will retry", extra={"error": str(exc)})
                return PushReport(errors=[f"{type(exc).__name__}: {exc}"])
            self._meter_ready = True
        with raw_transaction(self._engine) as conn:
            items = outbox.claim(
                conn,
                self._clock(),
                settings.stripe_push_batch_size,
                timedelta(seconds=settings.stripe_push_lease_s),
            )
        by_customer: dict[tuple[str, str], list[outbox.OutboxItem]] = {}
        for item in items:
            by_customer.setdefault((item.tenant_id, item.customer_id), []).append(item)
        report = PushReport()
        with ThreadPoolExecutor(max_workers=settings.stripe_push_threads) as pool:
            for future in [
                pool.submit(self._push_customer, rows, report) for rows in by_customer.values()
            ]:
                future.result()
        return report

    def _push_customer(self, items: list[outbox.OutboxItem], report: PushReport) -> None:
        for item in items:
            if not self._push_item(item, report):
                return  # keep the customer's order: the rest waits for this one

    def _push_item(self, item: outbox.OutboxItem, report: PushReport) -> bool:
        steps = item.plan if item.plan is not None else self._make_plan(item)
        if not steps:
            with raw_transaction(self._engine) as conn:
                outbox.finish_empty(conn, item, self._clock())
            report.add(sent_rows=1)
            return True
        for index in range(item.next_step, len(steps)):
            if not self._send_step(
                item, index, steps[index], last=index == len(steps) - 1, report=report
            ):
                return False
        report.add(sent_rows=1)
        return True

    def _make_plan(self, item: outbox.OutboxItem) -> list[Step]:
        now = self._clock()
        settings = self._settings
        with raw_transaction(self._engine) as conn:
            sent = outbox.load_sent(conn, item.run_id)
            carry = outbox.lock_carry(conn, item.tenant_id, item.customer_id, item.period)
            negative_ok = settings.stripe_allow_negative_meter_values and not (
                outbox.period_closed(conn, item.stripe_customer_id, item.event_timestamp)
            )
            steps, new_carry = plan(
                PlanInput(
                    run_id=item.run_id,
                    version=item.version,
                    target_micros=item.target_micros,
                    sent=sent,
                    now=now,
                    carry=carry,
                    event_time=item.event_timestamp,
                    unit_micros=settings.stripe_meter_unit_micros,
                    cancel_window=timedelta(seconds=settings.stripe_cancel_window_s),
                    negative_values_allowed=negative_ok,
                )
            )
            outbox.save_plan(conn, item, steps, new_carry)
        return steps

    def _send_step(
        self, item: outbox.OutboxItem, index: int, step: Step, *, last: bool, report: PushReport
    ) -> bool:
        key = f"fairmeter:{item.id}:{index}:{step.identifier}"
        note = None
        for quick_retry in range(self._settings.stripe_quick_retries + 1):
            try:
                received_at, note = self._call(item, step, key)
                report.add(calls=1)
                break
            except Exception as exc:  # classified: every SDK error maps to a verdict
                verdict = classify(exc)
                if verdict is Verdict.DELIVERED:
                    # Stripe had it already; treat it as old so it is never cancelled later.
                    received_at = self._clock() - timedelta(days=2)
                    note = "duplicate identifier: already delivered"
                    break
                if verdict is Verdict.DEAD or quick_retry == self._settings.stripe_quick_retries:
                    return self._failed(item, exc, verdict, report)
                # A blip: retry this call shortly, in place (same key, same parameters);
                # longer outages go through next_attempt_at instead.
                report.add(retried=1)
                time.sleep(backoff(quick_retry, self._settings, self._rng).total_seconds())
        with raw_transaction(self._engine) as conn:
            outbox.record_step(conn, item, index, step, received_at, note, last, self._clock())
        return True

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
