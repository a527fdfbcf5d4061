"""Planning a round's new rows: what Stripe has for each run, the carries, the open periods.

Split from the pusher (push.py): planning is one transaction that reads and locks, plans
every row with the pure planner (plan.py) and persists plans and carries before any call.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.engine import Engine

from metering.billing import carries, outbox
from metering.billing.plan import BillingPeriods, PlanInput, Sent, Step, plan
from metering.config import Settings
from metering.db import raw_transaction


class Planner:
    """Plans rows for a pusher (its engine, settings and clock)."""

    def __init__(self, engine: Engine, settings: Settings, clock: Callable[[], datetime]) -> None:
        self._engine = engine
        self._settings = settings
        self._clock = clock

    def make_plans(self, items: list[outbox.OutboxItem]) -> dict[int, list[Step]]:
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
            held = carries.lock(conn, [(i.tenant_id, i.customer_id) for i in items])
            periods = outbox.billing_periods(
                conn,
                [i.stripe_customer_id for i in items],
                timedelta(seconds=settings.stripe_finalization_grace_s),
                timedelta(seconds=settings.stripe_period_close_margin_s),
            )
            for item in items:
                key = (item.tenant_id, item.customer_id)
                steps, held[key] = plan(
                    self._plan_input(item, sent, held[key], now, periods[item.stripe_customer_id])
                )
                plans.append((item, steps))
            carries.save(conn, held)
            outbox.save_plans(conn, plans)
        return {item.id: steps for item, steps in plans}

    def _plan_input(
        self,
        item: outbox.OutboxItem,
        sent: dict[int, list[Sent]],
        carries: dict[str, int],
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
            carries=carries,
            event_time=item.event_timestamp,
            unit_micros=settings.stripe_meter_unit_micros,
            cancel_window=timedelta(seconds=settings.stripe_cancel_window_s),
            negative_values_allowed=settings.stripe_allow_negative_meter_values,
            periods=periods,
        )
