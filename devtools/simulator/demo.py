"""``fairmeter up``'s demo: a small simulation against the fresh service, linked to Stripe.

The demo sends a few dozen simulated runs for ``demo-customer`` and four other customers of
the demo tenant, waits until the worker has settled them, links the customers to customers
created in the Stripe emulator (so the outbox pushes their billed usage there), and tells
the user where to look.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import stripe
from sqlalchemy.engine import Engine

from devtools.simulator.plan import PlannedRun, Timing, TrafficSpec
from devtools.simulator.report import SimulationReport
from devtools.simulator.scenarios import Kind
from devtools.simulator.send import Checkpoint
from devtools.simulator.simulation import SimulationConfig, simulate
from metering.config import Settings
from metering.db import create_db_engine, raw_transaction
from metering.settlement.settle import policy_config

DEMO_RUNS = 40
DEMO_SEED = 2026
DEMO_SETTLE_TIMEOUT_S = 150.0
# Runs worth opening first: their explanation shows the protection at work.
SHOWCASE_KINDS = (Kind.RESUMED, Kind.PARTIAL_THEN_DROP, Kind.DUPLICATE_TOOL_CALL)


@dataclass(frozen=True)
class DemoResult:
    report: SimulationReport
    showcase_run: str | None  # a run of the main demo customer to open first
    linked: dict[str, str]  # customer → Stripe customer id (empty without the emulator)


def demo_customers(main_customer: str) -> list[str]:
    return [main_customer, "acme-robotics", "globex-agents", "initech-labs", "umbrella-ai"]


def demo_spec(settings: Settings, main_customer: str, anchor: datetime) -> TrafficSpec:
    return TrafficSpec(
        seed=DEMO_SEED,
        runs=DEMO_RUNS,
        customers=demo_customers(main_customer),
        anchor=anchor,
        run_prefix=f"demo-{anchor:%Y%m%dT%H%M%S}",
        timing=Timing.for_windows(
            settle_grace_s=settings.settle_grace_s, idle_timeout_s=settings.idle_timeout_s
        ),
    )


def showcase(planned: Sequence[PlannedRun], customer: str) -> str | None:
    """A run of ``customer`` that was credited, else any of its runs."""
    mine = [run for run in planned if run.scenario.customer == customer]
    for kind in SHOWCASE_KINDS:
        for run in mine:
            if run.scenario.kind is kind:
                return run.run_id
    return mine[0].run_id if mine else None


def link_to_emulator(
    settings: Settings, tenant: str, customers: Sequence[str], emulator_url: str
) -> dict[str, str]:
    """Link each demo customer to a Stripe customer of the emulator: the one it is linked to
    already while the emulator still knows it, else a new one.

    A second ``make up`` runs the demo again on the same database and the same (persisted)
    emulator: making new Stripe customers then left every earlier meter event on the old
    ids, and ``fairmeter stripe drift`` reported differences the demo itself made."""
    from metering.billing.service import link_customer

    client = stripe.StripeClient(
        "sk_test_emulator", base_addresses={"api": emulator_url}, max_network_retries=2
    )
    engine = create_db_engine(settings)
    linked = {}
    try:
        known = _stripe_ids(engine, tenant, customers)
        for customer in customers:
            stripe_id = known.get(customer)
            if stripe_id is None or not _exists(client, stripe_id):
                created = client.v1.customers.create(
                    params={"name": customer, "metadata": {"tenant": tenant, "customer": customer}}
                )
                stripe_id = created.id
                link_customer(engine, tenant, customer, stripe_id)
            linked[customer] = stripe_id
    finally:
        engine.dispose()
    return linked


def _stripe_ids(engine: Engine, tenant: str, customers: Sequence[str]) -> dict[str, str]:
    """The Stripe ids the customers are linked to now."""
    with raw_transaction(engine) as conn:
        rows = conn.execute(
            "SELECT id, stripe_customer_id FROM customers"
            " WHERE tenant_id = %s AND id = ANY(%s) AND stripe_customer_id IS NOT NULL",
            (tenant, list(customers)),
        ).fetchall()
    return {customer: stripe_id for customer, stripe_id in rows}


def _exists(client: stripe.StripeClient, stripe_id: str) -> bool:
    """Whether the emulator knows ``stripe_id`` (a fresh emulator state does not), and has
    not deleted it (Stripe answers a deleted customer's retrieve with ``deleted: true``)."""
    try:
        found = client.v1.customers.retrieve(stripe_id)
    except stripe.InvalidRequestError:  # 404 resource_missing
        return False
    return not getattr(found, "deleted", False)


def run_demo(
    settings: Settings,
    *,
    api_url: str,
    ingest_key: str,
    tenant: str,
    main_customer: str,
    emulator_url: str | None,
    checkpoint: Checkpoint,
    progress: bool,
) -> DemoResult:
    """Simulate, wait for settlement, link to the emulator (when there is one)."""
    spec = demo_spec(settings, main_customer, datetime.now(UTC).replace(microsecond=0))
    config = SimulationConfig(
        spec=spec,
        api_url=api_url,
        key=ingest_key,
        settle_timeout_s=DEMO_SETTLE_TIMEOUT_S,
        progress=progress,
        policy=policy_config(settings),
    )
    report = simulate(config, checkpoint)
    customers = sorted({run.scenario.customer for run in report.planned})
    linked = {}
    if emulator_url is not None:
        checkpoint()
        linked = link_to_emulator(settings, tenant, customers, emulator_url)
    return DemoResult(report, showcase(report.planned, main_customer), linked)


def where_to_look(
    result: DemoResult,
    *,
    api_url: str,
    main_customer: str,
    emulator_url: str | None,
) -> list[str]:
    """The lines telling the user what the demo made and where to see it."""
    report = result.report
    settled = len(report.planned) - len(report.mismatches)
    lines = [
        f"Demo: {len(report.planned)} simulated runs; {settled} settled as the policy "
        f"expects ({len(report.mismatches)} mismatches).",
    ]
    if result.showcase_run:
        lines.append(f"  a demo run: {api_url}/v1/runs/{result.showcase_run}")
    statement = f"{api_url}/v1/customers/{main_customer}/statements/current"
    lines += [
        "    (send `authorization: Bearer <ingest key>`; the customer key reads only its runs)",
        f"  statement: {statement}  (.html for the page, .csv for a spreadsheet)",
        f"  support console: {api_url}/console  (log in with the support key)",
        f"  OpenAPI docs: {api_url}/schema",
    ]
    if emulator_url is not None:
        lines += [
            f"  Stripe emulator: {emulator_url}  ({len(result.linked)} demo customers linked;"
            " the beat pushes their billed usage every few seconds)",
            f"  what Stripe received: GET {emulator_url}/_emulator/state",
        ]
    return lines
