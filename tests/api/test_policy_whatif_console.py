"""The console's "What if…" form over HTTP (the browser test is tests/e2e/
test_console_whatif.py): prefilled from the latest version, CSRF-checked, an impossible
knob shown on the form as a 422, and admin only."""

from __future__ import annotations

import csv
import io
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from api.console.session import SESSION_COOKIE, csrf_token
from tests.helpers.database import TEST_PEPPER
from tests.helpers.events import auth
from tests.protection.scenarios import PERIOD, settle_month
from tests.security.test_console_sessions import sign_in, visit

PAGE = "/console/policies/what-if"


@pytest.fixture
def tenant(engine, settings, db) -> str:
    name = f"wif-{uuid.uuid4().hex[:12]}"  # policy versions outlive a test
    settle_month(engine, settings, tenant=name)
    return name


def post(client: Any, token: str, path: str, **form: str) -> Any:
    client.cookies.clear()
    return client.post(
        path,
        data={"csrf": csrf_token(token, TEST_PEPPER), **form},
        headers={"cookie": f"{SESSION_COOKIE}={token}"},
        follow_redirects=False,
    )


def candidate(**changes: str) -> dict[str, str]:
    form = {
        "period": PERIOD,
        "cap_fraction_ppm": "250000",
        "cap_floor_micros": "5000000",
        "cap_runs": "20",
        "rule_R1": "on",
        "rule_R2": "on",
        "rule_R3": "on",
        "rule_R5": "on",  # R4 left unchecked: off
        "rule_R8": "on",
        "r7_action": "hold",
        "r7_under_micros": "",
    }
    return {**form, **changes}


def test_the_form_starts_from_the_latest_version(client, make_key, tenant):
    key = make_key(tenant=tenant, scope="admin")
    document = {"cap_runs": 3, "rules": {"R2": False}}
    made = client.post(
        "/v1/policies",
        content=json.dumps({"document": document}),
        headers=auth(key, **{"content-type": "application/json"}),
    )
    assert made.status_code == 201, made.text
    page = visit(client, sign_in(client, key), PAGE)
    assert page.status_code == 200, page.text
    assert 'name="cap_runs" value="3"' in page.text
    assert 'id="rule-R2" name="rule_R2" value="on" >' in page.text  # unchecked
    assert 'id="rule-R4" name="rule_R4" value="on" checked>' in page.text
    assert f'name="period" value="{datetime.now(UTC):%Y-%m}"' in page.text


def test_running_it_shows_totals_changes_and_customers(client, make_key, tenant):
    token = sign_in(client, make_key(tenant=tenant, scope="admin"))
    page = post(client, token, PAGE, **candidate())
    assert page.status_code == 200, page.text
    assert 'data-change="refunded→confirmed"' in page.text
    assert 'href="/console/runs/drop-run"' in page.text
    assert 'data-customer="cust-1"' in page.text and 'data-customer="cust-2"' in page.text
    assert 'id="reproduced"' in page.text
    download = post(client, token, PAGE + ".csv", table="customers", **candidate())
    assert download.status_code == 200
    assert download.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(download.text)))
    assert rows[-1]["customer"] == "(total)"


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"cap_runs": "-1"}, "cap_runs", "greater than or equal to 0"),
        ({"cap_floor_micros": "five"}, "cap_floor_micros", "whole number"),
        ({"period": "2026-13"}, "period", "YYYY-MM"),
        ({"r7_action": "auto_refund"}, "r7_under_micros", "whole number"),
    ],
)
def test_bad_input_is_shown_on_the_form_as_a_422(client, make_key, tenant, changes, field, message):
    token = sign_in(client, make_key(tenant=tenant, scope="admin"))
    page = post(client, token, PAGE, **candidate(**changes))
    assert page.status_code == 422, page.text
    assert f'id="error-{field}"' in page.text and message in page.text
    assert 'id="whatif-error"' in page.text and 'id="totals"' not in page.text
    assert post(client, token, PAGE + ".csv", **candidate(**changes)).status_code == 422


def test_a_form_without_the_sessions_token_runs_nothing(client, make_key, tenant):
    token = sign_in(client, make_key(tenant=tenant, scope="admin"))
    client.cookies.clear()
    page = client.post(
        PAGE, data=candidate(csrf="forged"), headers={"cookie": f"{SESSION_COOKIE}={token}"}
    )
    assert page.status_code == 403 and 'id="totals"' not in page.text


def test_a_support_key_cannot_run_it(client, make_key, tenant):
    token = sign_in(client, make_key(tenant=tenant, scope="support"))
    assert visit(client, token, PAGE).status_code == 403
    refused = post(client, token, PAGE, **candidate())
    assert refused.status_code == 403 and 'id="totals"' not in refused.text
    assert post(client, token, PAGE + ".csv", **candidate()).status_code == 403
