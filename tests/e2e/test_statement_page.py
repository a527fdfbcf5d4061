"""The HTML statement, rendered in headless Chromium: totals, one bar per day, marked runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from metering.money import format_usd
from metering.settlement.runner import settle_due_now
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import KINDS, scenario

NOW = datetime.now(UTC)
PERIOD = NOW.strftime("%Y-%m")


def test_statement_page_in_a_real_browser(
    live_server, browser, artifacts, make_key, engine, settings, db
):
    start = NOW.replace(day=1, hour=1, minute=0, second=0, microsecond=0)
    events = []
    for i, kind in enumerate(sorted(KINDS) * 2):
        day = min(i, max(NOW.day - 2, 0))
        events += scenario(kind, f"run-{i}", "cust-1", start + timedelta(days=day))
    ingest(engine, settings, events)
    settle_due_now(engine, settings, now=NOW)
    key = make_key(scope="customer", customer="cust-1")
    totals = db.execute(
        "SELECT sum(billed_micros) FILTER (WHERE outcome <> 'held_for_review') FROM runs"
    ).fetchone()[0]

    context = browser.new_context(
        extra_http_headers={"Authorization": f"Bearer {key}"},
        viewport={"width": 1200, "height": 1400},
    )
    page = context.new_page()
    try:
        response = page.goto(f"{live_server}/v1/customers/cust-1/statements/{PERIOD}.html")
        assert response is not None and response.status == 200
        assert page.locator("#total-billed").inner_text() == format_usd(int(totals))
        assert page.locator("#total-runs").inner_text() == "10"
        chart = page.locator("svg.daily-chart")
        assert chart.is_visible()
        days = int(chart.get_attribute("data-days") or 0)
        assert days in (28, 29, 30, 31)
        assert page.locator("svg.daily-chart rect.bar.billed").count() == days
        refunded = page.locator('tr[data-outcome="refunded"]')
        assert refunded.count() == 2
        assert "interrupted" in (refunded.first.get_attribute("class") or "")
        border = refunded.first.locator("td").first.evaluate(
            "el => getComputedStyle(el).borderLeftStyle"
        )
        assert border == "solid"  # interrupted runs are visibly marked
        page.screenshot(path=str(artifacts / "statement.png"), full_page=True)
    finally:
        context.close()
