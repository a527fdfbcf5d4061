"""POST /v1/policy/what-if as CSV: the same parameter and Accept convention as
/v1/reports/protection, a row per customer and a total row that the rows add up to, the
outcome changes as a second table, and a clear 4xx for a bad request."""

from __future__ import annotations

import csv
import io
import json
import uuid

import pytest

from metering.settlement.whatif_export import CHANGES_HEADER, CSV_HEADER
from tests.helpers.events import auth
from tests.protection.scenarios import LINE_COST, LINE_GROSS, PERIOD, settle_month

PATH = "/v1/policy/what-if"
JSON = {"content-type": "application/json"}
NO_R4 = {"period": PERIOD, "document": {"rules": {"R4": False}}}
IMPOSSIBLE = {"period": PERIOD, "document": {"cap_runs": -1}}


@pytest.fixture
def tenant(engine, settings, db) -> str:
    # Policy versions outlive a test (append-only): each test has its own tenant.
    name = f"wif-{uuid.uuid4().hex[:12]}"
    settle_month(engine, settings, tenant=name)
    return name


def ask(client, key: str, body=NO_R4, params=None, accept: str | None = None):
    headers = auth(key, **JSON, **({"accept": accept} if accept else {}))
    return client.post(PATH, content=json.dumps(body), params=params or {}, headers=headers)


@pytest.mark.parametrize(("params", "accept"), [({"format": "csv"}, None), ({}, "text/csv")])
def test_csv_has_a_row_per_customer_and_a_total_row_they_add_up_to(
    client, make_key, tenant, params, accept
):
    reply = ask(client, make_key(tenant=tenant, scope="admin"), params=params, accept=accept)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/csv")
    assert f'filename="what-if-{PERIOD}.csv"' in reply.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(reply.text)))
    assert list(rows[0]) == CSV_HEADER
    assert [r["customer"] for r in rows] == ["cust-1", "cust-2", "(total)"]
    for column in CSV_HEADER[1:]:
        assert int(rows[0][column]) + int(rows[1][column]) == int(rows[2][column]), column
    total = rows[-1]
    # R1 + R4 + R5 credit 7 lines in force; with R4 off, R4's 4 lines are billed instead.
    assert int(total["current_credited_micros"]) == 7 * LINE_GROSS
    assert int(total["candidate_credited_micros"]) == 3 * LINE_GROSS
    assert int(total["current_credited_provider_cost_micros"]) == 7 * LINE_COST
    for amount in ("billed", "provider_cost", "margin_after"):
        assert int(total[f"candidate_{amount}_micros"]) >= int(total[f"current_{amount}_micros"])
    json_total = ask(client, make_key(tenant=tenant, scope="admin")).json()["total"]
    assert (
        int(total["candidate_margin_after_micros"])
        == json_total["candidate"]["margin_after_micros"]
    )


def test_the_outcome_changes_are_a_table_of_their_own(client, make_key, tenant):
    key = make_key(tenant=tenant, scope="admin")
    reply = ask(client, key, params={"format": "csv", "table": "changes"})
    assert reply.status_code == 200, reply.text
    assert f"what-if-{PERIOD}-changes.csv" in reply.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(reply.text)))
    assert list(rows[0]) == CHANGES_HEADER
    changes = ask(client, key).json()["changes"]
    assert [(r["old_outcome"], r["new_outcome"], int(r["runs"])) for r in rows] == [
        (c["old_outcome"], c["new_outcome"], c["runs"]) for c in changes
    ]
    assert "drop-run" in ";".join(r["example_runs"] for r in rows)


def test_json_stays_the_default_and_an_explicit_format_wins_over_accept(client, make_key, tenant):
    key = make_key(tenant=tenant, scope="admin")
    assert ask(client, key).headers["content-type"].startswith("application/json")
    chosen = ask(client, key, params={"format": "json"}, accept="text/csv")
    assert chosen.headers["content-type"].startswith("application/json")


@pytest.mark.parametrize(
    ("body", "params", "path"),
    [
        (NO_R4, {"format": "xml"}, "$.format"),
        (NO_R4, {"format": "csv", "table": "runs"}, "$.table"),
        ({"period": "2026-13"}, {"format": "csv"}, "$.period"),
        (IMPOSSIBLE, {"format": "csv"}, "$.document.cap_runs"),
    ],
)
def test_a_bad_request_is_422_naming_the_field_never_a_csv(
    client, make_key, tenant, body, params, path
):
    reply = ask(client, make_key(tenant=tenant, scope="admin"), body=body, params=params)
    assert reply.status_code == 422, reply.text
    assert reply.headers["content-type"].startswith("application/problem+json")
    assert reply.json()["errors"][0]["path"] == path


def test_a_support_key_gets_no_csv(client, make_key, tenant):
    reply = ask(client, make_key(tenant=tenant, scope="support"), params={"format": "csv"})
    assert reply.status_code == 403
