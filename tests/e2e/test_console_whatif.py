"""The console's "What if…" page in headless Chromium: an admin goes from the policies page
to the form (filled from the latest version), switches R4 off, reads totals, the outcome
changes and the customers at desktop and phone widths, downloads the CSV and follows an
example run; an impossible knob is shown on the form; a support key cannot run it."""

from __future__ import annotations

import csv
import io
import uuid
from pathlib import Path

import pytest

from metering.settlement.whatif_export import CSV_HEADER
from tests.e2e.conftest import WAIT_MS
from tests.e2e.test_console import _OVERFLOWS, _amounts_never_read_as_zero, sign_in
from tests.protection.scenarios import LINE_GROSS, PERIOD, settle_month

pytestmark = pytest.mark.timeout(300)
G = LINE_GROSS


@pytest.fixture
def tenant(engine, settings, db) -> str:
    name = f"wif-{uuid.uuid4().hex[:12]}"  # policy versions outlive a test
    settle_month(engine, settings, tenant=name)
    return name


def _micros(page, selector: str) -> int:
    return int(page.locator(f"{selector} .usd").get_attribute("data-micros"))


@pytest.mark.parametrize("width", [1366, 420])
def test_an_admin_prices_a_candidate_policy_and_downloads_it(
    live_server, browser, make_key, tenant, artifacts, width
):
    context = browser.new_context(viewport={"width": width, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        sign_in(page, live_server, make_key(tenant=tenant, scope="admin"))
        page.click("#nav-policies")
        page.click("#whatif-link")
        page.wait_for_url(f"{live_server}/console/policies/what-if")
        assert page.input_value("#knob-cap_runs") == "20"  # version 0: the settings
        assert page.is_checked("#rule-R4") and page.input_value("#r7-action") == "hold"
        assert page.evaluate(_OVERFLOWS) == [], width
        page.fill("#period-input", PERIOD)
        page.uncheck("#rule-R4")
        page.click("#whatif-run")
        page.wait_for_selector("#totals")
        assert page.locator("#result-period").inner_text() == PERIOD
        credited = '#totals-table tr[data-row="credited_micros"]'
        assert _micros(page, f'{credited} td[data-side="current"]') == 7 * G
        assert _micros(page, f'{credited} td[data-side="candidate"]') == 3 * G
        assert _micros(page, f'{credited} td[data-side="change"]') == -4 * G
        margin = '#totals-table tr[data-row="margin_after_micros"] td[data-side="change"]'
        assert _micros(page, margin) == 4 * G  # what R4 gives back: billed instead
        change = page.locator('#changes-table tr[data-change="refunded→confirmed"]')
        assert change.is_visible()
        customers = page.locator("#customers-table tbody tr")
        assert [r.get_attribute("data-customer") for r in customers.all()] == ["cust-1", "cust-2"]
        assert page.locator("#reproduced").is_visible()
        _amounts_never_read_as_zero(page)
        assert page.evaluate(_OVERFLOWS) == [], width
        page.screenshot(path=str(artifacts / f"console-whatif-{width}.png"), full_page=True)

        with page.expect_download() as download:
            page.click("#csv-link")
        assert download.value.suggested_filename == f"what-if-{PERIOD}.csv"
        text = Path(download.value.path()).read_text(encoding="utf-8")
        rows = list(csv.DictReader(io.StringIO(text)))
        assert [r["customer"] for r in rows] == ["cust-1", "cust-2", "(total)"]
        for column in CSV_HEADER[1:]:
            assert int(rows[0][column]) + int(rows[1][column]) == int(rows[2][column])
        assert int(rows[-1]["candidate_credited_micros"]) == 3 * G

        change.locator('a[data-run="drop-run"]').click()
        page.wait_for_url(f"{live_server}/console/runs/drop-run")
    finally:
        context.close()


def test_an_impossible_knob_is_shown_on_the_form(live_server, page, make_key, tenant):
    sign_in(page, live_server, make_key(tenant=tenant, scope="admin"))
    page.goto(f"{live_server}/console/policies/what-if")
    page.fill("#knob-cap_runs", "-1")
    with page.expect_navigation() as sent:
        page.click("#whatif-run")
    assert sent.value is not None and sent.value.status == 422
    assert "greater than or equal to 0" in page.locator("#error-cap_runs").inner_text()
    assert page.input_value("#knob-cap_runs") == "-1"  # what was typed stays
    assert page.locator("#totals").count() == 0


def test_a_support_key_cannot_run_a_what_if(live_server, page, make_key, tenant):
    sign_in(page, live_server, make_key(tenant=tenant, scope="support"))
    assert page.locator("#nav-policies").count() == 0
    csrf = page.locator('input[name="csrf"]').first.get_attribute("value") or ""
    reply = page.goto(f"{live_server}/console/policies/what-if")
    assert reply is not None and reply.status == 403
    assert "admin" in page.locator("main").inner_text()
    form = {"csrf": csrf, "period": PERIOD, "cap_fraction_ppm": "0", "cap_floor_micros": "0"}
    form |= {"cap_runs": "0", "r7_action": "hold"}
    for path in ("/console/policies/what-if", "/console/policies/what-if.csv"):
        refused = page.request.post(f"{live_server}{path}", form=form)
        assert refused.status == 403, path
        assert "cust-1" not in refused.text()
