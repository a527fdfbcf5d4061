"""GET /v1/reports/protection: admin keys, the key's own tenant, JSON or CSV, clear 4xx."""

from __future__ import annotations

import csv
import io

import pytest

from metering.protection.export import CSV_HEADER
from tests.helpers.events import auth
from tests.protection.scenarios import LINE_COST, LINE_GROSS, PERIOD, settle_month

G, C = LINE_GROSS, LINE_COST
PATH = "/v1/reports/protection"


@pytest.fixture
def month(engine, settings, db) -> None:
    settle_month(engine, settings)


def test_admin_gets_the_period_as_json_with_parts_that_add_up(client, make_key, month):
    reply = client.get(PATH, params={"period": PERIOD}, headers=auth(make_key(scope="admin")))
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert (body["tenant"], body["period"], body["currency"]) == ("acme", PERIOD, "usd")
    total = body["total"]
    assert total["credited_micros"] == sum(total["credited_by_rule"].values()) == 7 * G
    assert total["gross_micros"] == total["billed_micros"] + 7 * G + total["held_micros"]
    assert total["credited_provider_cost_micros"] == 7 * C
    assert total["margin_before_micros"] == total["gross_micros"] - total["provider_cost_micros"]
    assert [c["customer"] for c in body["customers"]] == ["cust-1", "cust-2"]
    assert body["top_by_restored_cost"][0]["customer"] == "cust-1"
    assert body["rules"]["R3"] == "lost work"


@pytest.mark.parametrize("ask", [{"format": "csv"}, {"accept": "text/csv"}])
def test_csv_has_a_row_per_customer_and_a_total_row(client, make_key, month, ask):
    headers = auth(
        make_key(scope="admin"), **({"accept": ask["accept"]} if "accept" in ask else {})
    )
    params = {"period": PERIOD, **({"format": ask["format"]} if "format" in ask else {})}
    reply = client.get(PATH, params=params, headers=headers)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/csv")
    assert f"protection-{PERIOD}.csv" in reply.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(reply.text)))
    assert list(rows[0]) == CSV_HEADER
    assert [r["customer"] for r in rows] == ["cust-1", "cust-2", "(total)"]
    for column in CSV_HEADER[1:]:
        assert int(rows[0][column]) + int(rows[1][column]) == int(rows[2][column])


@pytest.mark.parametrize("scope", ["support", "ingest"])
def test_keys_that_are_not_admin_are_refused(client, make_key, month, scope):
    reply = client.get(PATH, params={"period": PERIOD}, headers=auth(make_key(scope=scope)))
    assert reply.status_code == 403
    assert reply.json()["code"] == "forbidden"


def test_a_customer_key_is_refused(client, make_key, month):
    key = make_key(scope="customer", customer="cust-1")
    assert client.get(PATH, params={"period": PERIOD}, headers=auth(key)).status_code == 403


@pytest.mark.parametrize(
    ("params", "path"),
    [({"period": "2026-13"}, "$.period"), ({"period": PERIOD, "format": "xml"}, "$.format")],
)
def test_bad_parameters_are_422_naming_the_field(client, make_key, month, params, path):
    reply = client.get(PATH, params=params, headers=auth(make_key(scope="admin")))
    assert reply.status_code == 422
    assert reply.json()["errors"][0]["path"] == path


def test_another_tenants_admin_sees_an_empty_report(client, make_key, month):
    key = make_key(tenant="globex", scope="admin")
    body = client.get(PATH, params={"period": PERIOD}, headers=auth(key)).json()
    assert (body["tenant"], body["customers"], body["total"]["runs"]) == ("globex", [], 0)
