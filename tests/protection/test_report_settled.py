"""The cost of protection report over runs settled by the real settlement, on the real DB."""

from __future__ import annotations

import json
from typing import Any

from metering.db import raw_transaction
from metering.protection.query import protection_report
from tests.helpers.events import auth
from tests.protection.scenarios import LINE_COST, LINE_GROSS, PERIOD, settle_month

G, C = LINE_GROSS, LINE_COST


def credit(client: Any, key: str, run: str, body: dict[str, Any]) -> None:
    reply = client.post(
        f"/v1/support/runs/{run}/credit",
        content=json.dumps({**body, "reason": "Goodwill."}),
        headers=auth(key, **{"content-type": "application/json"}),
    )
    assert reply.status_code == 200, reply.text


def test_report_splits_credits_by_rule_and_prices_the_credited_lines_at_provider_cost(
    engine, settings, db, client, make_key
):
    settle_month(engine, settings)
    credit(client, make_key(scope="admin"), "credited-run", {"full": True})
    with raw_transaction(engine) as conn:
        report = protection_report(conn, "acme", PERIOD)
    one, two = (c.figures for c in report.customers)
    assert [c.customer_id for c in report.customers] == ["cust-1", "cust-2"]
    assert (one.runs, one.gross_micros, one.billed_micros) == (4, 9 * G, 3 * G)
    assert (one.credited_micros, one.held_micros) == (4 * G, 2 * G)
    assert {k: v for k, v in one.by_rule().items() if v} == {"R4": 2 * G, "R5": 2 * G}
    assert (one.cost_micros, one.credited_cost_micros) == (9 * C, 4 * C)
    assert one.margin_before_micros == 9 * (G - C)
    assert one.margin_after_micros == 3 * G - 9 * C
    credits = {k: v for k, v in two.by_rule().items() if v}
    assert credits == {"R1": G, "R4": 2 * G, "support": 2 * G}
    costs = {k: v for k, v in two.cost_by_rule().items() if v}
    assert costs == {"R1": C, "R4": 2 * C, "support": 2 * C}
    assert (two.credited_micros, two.billed_micros, two.credited_cost_micros) == (5 * G, 0, 5 * C)
    assert report.total.credited_micros == sum(report.total.by_rule().values()) == 9 * G
    assert [c.customer_id for c in report.top_by_restored_cost] == ["cust-2", "cust-1"]
    assert report.total.uncosted_lines == 0


def test_another_tenant_and_another_period_see_none_of_it(engine, settings, db):
    settle_month(engine, settings)
    with raw_transaction(engine) as conn:
        other_tenant = protection_report(conn, "globex", PERIOD)
        other_period = protection_report(conn, "acme", "2020-01")
    assert other_tenant.customers == other_period.customers == ()
    assert other_tenant.total.runs == 0


def test_a_support_credit_made_later_moves_the_run_to_support_credits(
    engine, settings, db, client, make_key
):
    settle_month(engine, settings)
    credit(client, make_key(scope="admin"), "ok-run", {"amount_micros": 100})
    with raw_transaction(engine) as conn:
        report = protection_report(conn, "acme", PERIOD)
    one = report.customers[0].figures
    assert one.by_rule()["support"] == 100
    # Support credits an amount, not lines: its cost is its share of the billed lines' cost.
    assert one.credited_cost_micros == 4 * C + 100 * C // G
