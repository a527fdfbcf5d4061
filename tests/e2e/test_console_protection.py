"""The console's cost of protection page in headless Chromium: an admin reads a settled
month (totals, the chart of credits by rule, customers) at desktop and phone widths and
downloads the CSV; a support key sees no nav entry and gets a 403."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from metering.money import display_usd
from tests.e2e.test_console import _OVERFLOWS, _amounts_never_read_as_zero, sign_in
from tests.protection.scenarios import LINE_COST, LINE_GROSS, PERIOD, settle_month

pytestmark = pytest.mark.timeout(300)
G, C = LINE_GROSS, LINE_COST


@pytest.fixture
def month(engine, settings, db) -> None:
    settle_month(engine, settings)


@pytest.mark.parametrize("width", [1366, 420])
def test_an_admin_reads_the_months_cost_of_protection_and_downloads_it(
    live_server, browser, make_key, month, artifacts, width
):
    context = browser.new_context(viewport={"width": width, "height": 900}, accept_downloads=True)
    page = context.new_page()
    try:
        sign_in(page, live_server, make_key(scope="admin"))
        page.click("#nav-protection")
        page.wait_for_url(f"{live_server}/console/protection")
        if page.locator("#period").inner_text() != PERIOD:  # the run ended last month
            page.fill("#period-input", PERIOD)
            page.click("#period-button")
        assert page.locator("#period").inner_text() == PERIOD
        assert page.locator("#kpi-credited .usd").get_attribute("data-micros") == str(7 * G)
        assert page.locator("#kpi-restored .usd").inner_text() == display_usd(7 * C)
        bars = page.locator("#credited-chart g.rule-row")
        shown = {b.get_attribute("data-rule"): b.get_attribute("data-micros") for b in bars.all()}
        assert shown == {
            "R1": str(G),
            "R2": "0",
            "R3": "0",
            "R4": str(4 * G),
            "R5": str(2 * G),
            "support": "0",
        }
        r1 = page.locator('#credited-chart g[data-rule="R1"] .rule-amount').text_content()
        assert r1 == f"{display_usd(G)} USD" != "0.00 USD"
        assert page.locator('#credited-chart g[data-rule="R4"] rect').bounding_box()["width"] > 0
        tip = page.locator('#credited-chart g[data-rule="R4"] > title').text_content() or ""
        assert f"({4 * G:,} micro-USD) credited" in tip and f"({4 * C:,} micro-USD)" in tip
        rows = page.locator("#customers-table tbody tr")
        assert [r.get_attribute("data-customer") for r in rows.all()] == ["cust-1", "cust-2"]
        assert page.locator("#top-table tbody tr").first.get_attribute("data-customer") == "cust-1"
        _amounts_never_read_as_zero(page)
        assert page.evaluate(_OVERFLOWS) == [], width
        page.screenshot(path=str(artifacts / f"console-protection-{width}.png"), full_page=True)

        with page.expect_download() as download:
            page.click("#csv-link")
        text = Path(download.value.path()).read_text(encoding="utf-8")
        rows_csv = list(csv.DictReader(io.StringIO(text)))
        assert [r["customer"] for r in rows_csv] == ["cust-1", "cust-2", "(total)"]
        assert int(rows_csv[-1]["credited_provider_cost_micros"]) == 7 * C
    finally:
        context.close()


def test_a_support_key_cannot_see_the_cost_of_protection(live_server, page, make_key, month):
    sign_in(page, live_server, make_key(scope="support"))
    assert page.locator("#nav-protection").count() == 0
    csv_reply = page.request.get(f"{live_server}/console/protection.csv?period={PERIOD}")
    assert csv_reply.status == 403
    reply = page.goto(f"{live_server}/console/protection?period={PERIOD}")
    assert reply is not None and reply.status == 403
    assert "the protection report needs admin" in page.locator("main").inner_text()
