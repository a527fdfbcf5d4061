"""What the billing tests share besides fixtures: runs settled for the pusher to send, the
emulator set up for a test (its settings, event destinations and clock), meters and prices
in it, and driving the outbox until it is empty; then following usage onto Stripe's invoices
across a month end and comparing them with the ledger."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import stripe

from devtools.stripe_emulator.control_client import EmulatorControl
from metering.billing.push import Pusher, PushReport
from metering.billing.service import handle_webhooks, link_customer
from metering.config import Settings
from metering.db import raw_transaction
from metering.disputes.service import Credit, grant_credit
from metering.keys import Principal, Scope
from metering.runs import find_run_id
from metering.settlement.runner import settle_due_now
from tests.helpers.events import event, usage
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import scenario

START = datetime.now(UTC) - timedelta(hours=2)  # when the runs of a test began
ADMIN = Principal(tenant_id="acme", scope=Scope.ADMIN, key_id="test-admin")
UNIT_MICROS = 10_000  # one meter unit = one cent, priced at 1 minor unit by the emulator
SNAPSHOT_SECRET = "whsec_test"  # the signing secrets of the two event destinations
THIN_SECRET = "whsec_thin_test"
UNKNOWN_TO_STRIPE = "cus_not_in_stripe"  # a Stripe id Stripe takes, then rejects


# Runs, settled


def settle(engine: Any, settings: Settings, events: list[dict[str, Any]]) -> None:
    """Ingest ``events`` and settle every run that is due now, through the use cases."""
    ingest(engine, settings, events)
    settle_due_now(engine, settings, now=datetime.now(UTC))


def big_run(engine: Any, settings: Any, run: str, customer: str) -> None:
    """Two steps of 600,000 micros each (agent-large-1), completed: bills 1,200,000."""
    steps = [step_usage(run, customer, step=s) for s in (1, 2)]
    completed = event(
        run=run, customer=customer, type="run.completed", time=START + timedelta(minutes=3)
    )
    settle(engine, settings, [*steps, completed])


def small_run(engine: Any, settings: Any, run: str, customer: str) -> None:
    """One step of 600,000 micros, completed (a different amount from ``big_run``)."""
    completed = event(
        run=run, customer=customer, type="run.completed", time=START + timedelta(minutes=2)
    )
    settle(engine, settings, [step_usage(run, customer, step=1), completed])


def late_usage(engine: Any, settings: Any, run: str, customer: str) -> None:
    """A third step of 300,000 micros, dated inside ``big_run``, arriving after it settled:
    the run is settled again and bills 300,000 more."""
    late = usage(
        run=run,
        customer=customer,
        step=3,
        input_tokens=50_000,
        output_tokens=10_000,
        time=START + timedelta(minutes=2.5),
    )
    settle(engine, settings, [late])


def step_usage(run: str, customer: str, *, step: int) -> dict[str, Any]:
    """A step of 600,000 micros (100,000 input and 20,000 output tokens), ``step`` minutes
    after ``START``."""
    return usage(
        run=run,
        customer=customer,
        step=step,
        input_tokens=100_000,
        output_tokens=20_000,
        time=START + timedelta(minutes=step),
    )


def settled_runs(
    engine: Any,
    settings: Settings,
    runs: int,
    customers: int,
    kinds: tuple[str, ...] = ("completed", "partial-delivery", "user-cancel"),
    start: datetime | None = None,
) -> None:
    """``runs`` runs of ``kinds`` in turn over ``customers`` customers, ingested and settled
    through the use cases (devtools/bulk.py writes settled rows in SQL instead, for volume)."""
    start = start or datetime.now(UTC) - timedelta(hours=2)
    batch: list[dict[str, Any]] = []
    for i in range(runs):
        batch += scenario(kinds[i % len(kinds)], f"run-{i}", f"cust-{i % customers}", start)
        if len(batch) >= 900:
            ingest(engine, settings, batch)
            batch = []
    if batch:
        ingest(engine, settings, batch)
    settle_due_now(engine, settings, now=datetime.now(UTC))


def credit(engine: Any, settings: Any, run: str, micros: int, now: datetime) -> None:
    """An admin's credit of ``micros`` on ``run``, which settles it again."""
    with raw_transaction(engine) as conn:
        grant_credit(
            conn,
            ADMIN,
            find_run_id(conn, ADMIN, run),
            Credit(amount_micros=micros),
            reason="correction test",
            settings=settings,
            now=now,
            action="run.credit",
        )


def run_id_of(db: Any, run: str) -> int:
    return int(db.execute("SELECT id FROM runs WHERE subject = %s", (run,)).fetchone()[0])


def link_unknown_to_stripe(engine: Any, customer: str) -> None:
    """Link ``customer`` to a Stripe id Stripe does not have: with asynchronous validation
    its meter events are taken (200) and rejected later, in an error report."""
    link_customer(engine, "acme", customer, UNKNOWN_TO_STRIPE)


# The emulator


def invoicing_settings(stripe_settings: Settings, **changes: Any) -> Settings:
    return stripe_settings.model_copy(update={"stripe_meter_unit_micros": UNIT_MICROS, **changes})


def subscribe_destinations(control: EmulatorControl, api: str) -> None:
    control.add_destination(url=f"{api}/webhooks/stripe", secret=SNAPSHOT_SECRET, style="snapshot")
    control.add_destination(url=f"{api}/webhooks/stripe/thin", secret=THIN_SECRET, style="thin")


@dataclass
class Clocks:
    """Our pusher's clock and the emulator's, moved together; the emulator's is frozen."""

    control: EmulatorControl
    offset: timedelta = field(default=timedelta(0))

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def jump(self, to: datetime) -> None:
        self.offset = to - datetime.now(UTC)
        self.control.set_clock(int(to.timestamp()), frozen=True)

    def start(self) -> None:
        self.jump(datetime.now(UTC))

    @property
    def clock(self) -> Callable[[], datetime]:
        return self.now


@dataclass(frozen=True)
class Invoicing:
    """A test that follows usage onto invoices: its settings and the clocks it moves."""

    settings: Settings
    clocks: Clocks

    def pusher(self, engine: Any) -> Pusher:
        """A pusher on the test's clock."""
        return Pusher(engine, self.settings, clock=self.clocks.clock)


def start_invoicing(
    stripe_settings: Settings,
    control: EmulatorControl,
    webhook_api: str | None = None,
    *,
    emulator: dict[str, Any] | None = None,
    **changes: Any,
) -> Invoicing:
    """Invoicing settings (one meter unit = one minor unit; ``changes`` on top), the emulator's
    ``emulator`` settings, its events sent to ``webhook_api``'s two destinations (when
    given), and both clocks started, frozen at now."""
    settings = invoicing_settings(stripe_settings, **changes)
    if emulator:
        control.settings(**emulator)
    if webhook_api is not None:
        subscribe_destinations(control, webhook_api)
    clocks = Clocks(control)
    clocks.start()
    return Invoicing(settings, clocks)


def create_meter(sdk: stripe.StripeClient, event_name: str, display_name: str = "") -> str:
    """A summing meter of ``event_name`` keyed by ``stripe_customer_id``, as the pusher's."""
    meter = sdk.v1.billing.meters.create(
        params={
            "display_name": display_name or event_name,
            "event_name": event_name,
            "default_aggregation": {"formula": "sum"},
            "customer_mapping": {"event_payload_key": "stripe_customer_id", "type": "by_id"},
            "value_settings": {"event_payload_key": "value"},
        }
    )
    return str(meter.id)


def meter_with_price(sdk: stripe.StripeClient, event_name: str) -> tuple[str, str]:
    """A meter of ``event_name`` and a monthly metered EUR price of 1 minor unit on it:
    ``(meter id, price id)``."""
    meter_id = create_meter(sdk, event_name)
    price = sdk.v1.prices.create(
        params={
            "currency": "eur",
            "unit_amount": 1,
            "product_data": {"name": event_name},
            "recurring": {"interval": "month", "usage_type": "metered", "meter": meter_id},
        }
    )
    return meter_id, str(price.id)


def events_of(control: Any, run_id: int) -> dict[str, dict[str, Any]]:
    """The meter events Stripe holds for one run, by identifier."""
    return {
        e["identifier"]: e
        for e in control.state()["meter_events"]
        if e["identifier"].startswith(f"run:{run_id}:")
    }


# Driving the outbox


def drain(pusher: Pusher, engine: Any, deadline_s: float = 120) -> list[PushReport]:
    """Push until no row is pending (bounded); returns each round's report."""
    reports = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        reports.append(pusher.push_due())
        with raw_transaction(engine) as conn:
            (pending,) = conn.execute(
                "SELECT count(*) FROM stripe_outbox WHERE status = 'pending'"
            ).fetchone() or (0,)
        if pending == 0:
            return reports
        time.sleep(0.05)
    with raw_transaction(engine) as conn:
        stuck = conn.execute(
            "SELECT id, next_step, attempts, last_error FROM stripe_outbox "
            "WHERE status = 'pending' ORDER BY id LIMIT 5"
        ).fetchall()
    raise TimeoutError(f"outbox still has pending rows: {stuck}")


def wait_for(predicate: Callable[[], bool], deadline_s: float = 60.0) -> None:
    """Poll ``predicate`` until it holds (bounded): a race's moment, such as Stripe holding
    an event whose reply the pusher still awaits."""
    deadline = time.monotonic() + deadline_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def push_all(
    engine: Any,
    settings: Settings,
    clock: Callable[[], datetime] | None = None,
    deadline_s: float = 120,
) -> list[PushReport]:
    """A fresh pusher (``clock``: its idea of now) drains the outbox."""
    pusher = Pusher(engine, settings) if clock is None else Pusher(engine, settings, clock=clock)
    return drain(pusher, engine, deadline_s)


# Invoices across a month end


def month_end(moment: datetime) -> datetime:
    """The start of the next UTC month (Stripe's emulator bills calendar months)."""
    first = moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return (first + timedelta(days=32)).replace(day=1)


def away_from_a_month_end() -> pytest.MarkDecorator:
    """These tests date runs two hours before the wall clock, may move a day on, and follow
    the runs onto their month's invoice: within a few hours after a month starts, or a day
    before it ends, the runs' month closes under them. Skipped then rather than flaky."""
    now = datetime.now(UTC)
    since_start = now - now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    until_end = month_end(now) - now
    return pytest.mark.skipif(
        since_start < timedelta(hours=4) or until_end < timedelta(hours=27),
        reason="too close to a month end",
    )


def finalize_month_of(
    moment: datetime, clocks: Clocks, engine: Any, settings: Settings
) -> datetime:
    """Move past the month's end and Stripe's one-hour grace: the invoice is drafted, then
    finalized, and both webhooks are handled. Returns the new now."""
    after = month_end(moment) + timedelta(hours=1, minutes=1)
    clocks.jump(after)
    clocks.control.run_invoicing()
    handle_webhooks(engine, settings)
    return after


def period_of(stamp: int) -> str:
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m")


def invoiced_minor(sdk: stripe.StripeClient, stripe_id: str) -> dict[str, int]:
    """Per period: the finalized invoice's total minus its credit notes (minor units)."""
    invoices = sdk.v1.invoices.list(params={"customer": stripe_id, "limit": 100}).data
    notes = sdk.v1.credit_notes.list(params={"customer": stripe_id, "limit": 100}).data
    found: dict[str, int] = {}
    for invoice in invoices:
        assert invoice.status != "draft", "every invoice of the test is finalized"
        credited = sum(note.amount for note in notes if note.invoice == invoice.id)
        period = period_of(invoice.period_start)
        found[period] = found.get(period, 0) + invoice.total - credited
    return {period: amount for period, amount in found.items() if amount}


def billed_minor(db: Any, customer: str) -> dict[str, int]:
    """Per period: what the ledger bills the customer, in the same minor units."""
    rows = db.execute(
        "SELECT period, sum(billed_micros) FROM runs WHERE customer_id = %s GROUP BY period",
        (customer,),
    ).fetchall()
    return {period: int(micros) // UNIT_MICROS for period, micros in rows if micros}
