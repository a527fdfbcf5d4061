"""The HTML statement, rendered in headless Chromium: totals, one bar per day, marked runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from metering.money import display_usd
from metering.settlement.runner import settle_due_now
from metering.statements import links
from tests.e2e.conftest import ARTIFACTS
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
        assert page.locator("#total-billed").inner_text() == display_usd(int(totals))
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


def _settled_statement(engine, settings, make_key) -> str:
    start = NOW.replace(day=1, hour=1, minute=0, second=0, microsecond=0)
    events = []
    for i, kind in enumerate(sorted(KINDS)):
        events += scenario(kind, f"run-{i}", "cust-1", start)
    ingest(engine, settings, events)
    settle_due_now(engine, settings, now=NOW)
    return make_key(scope="customer", customer="cust-1")


@pytest.mark.parametrize("width", [1366, 420])
def test_statement_shows_held_and_never_rounds_money_to_zero(
    live_server, browser, make_key, engine, settings, db, width
):
    key = _settled_statement(engine, settings, make_key)
    context = browser.new_context(
        extra_http_headers={"Authorization": f"Bearer {key}"},
        viewport={"width": width, "height": 1000},
    )
    page = context.new_page()
    try:
        page.goto(f"{live_server}/v1/customers/cust-1/statements/{PERIOD}.html")

        def micros(selector: str) -> int:
            amount = page.locator(f"{selector} .usd")
            return int(amount.get_attribute("data-micros") or "x")

        gross, billed, credited, held = (
            micros(f"#total-{name}") for name in ("gross", "billed", "credited", "held")
        )
        assert held > 0 and credited > 0
        assert gross == billed + credited + held  # every dollar of usage is accounted for
        assert page.locator("#total-held").is_visible()
        # Nothing runs off the side of a phone: a wide table scrolls in its own box.
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        # No amount a person reads is zero unless it is zero, and the tooltip is exact.
        for amount in page.locator(".usd").all():
            value = int(amount.get_attribute("data-micros") or "x")
            shown = amount.inner_text()
            assert (float(shown) == 0) == (value == 0), (shown, value)
            assert f"({value:,} micro-USD)" in (amount.get_attribute("title") or "")
        # The chart has a y-axis in USD: labels at zero and at the top.
        ticks = page.locator("svg.daily-chart text.ytick")
        assert ticks.count() == 3
        assert ticks.first.text_content() == "0.00"
        assert float(ticks.last.text_content() or "0") > 0
        page.screenshot(path=str(ARTIFACTS / f"statement-{width}.png"), full_page=True)
    finally:
        context.close()


@pytest.mark.parametrize("width", [1366, 420])
def test_a_customer_opens_their_statement_from_a_signed_link_in_a_browser(
    live_server, browser, make_key, engine, settings, db, width
):
    _settled_statement(engine, settings, make_key)
    support = make_key(scope="support")
    made = httpx.post(
        f"{live_server}/v1/support/customers/cust-1/statement-links",
        json={"period": "current"},
        headers={"authorization": f"Bearer {support}"},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    link = made.json()["url"]
    assert link.startswith("/v1/statement-links/")
    context = browser.new_context(viewport={"width": width, "height": 900})  # no header
    page = context.new_page()
    try:
        response = page.goto(f"{live_server}{link}")
        assert response is not None and response.status == 200
        assert page.locator("h1").inner_text() == f"Usage statement — {PERIOD}"
        assert page.locator("#total-runs").inner_text() == "5"
        assert "cust-1" in page.locator("header").inner_text()
        # A changed token opens nothing.
        forged = page.goto(f"{live_server}{link[:-3]}abc")
        assert forged is not None and forged.status == 401
    finally:
        context.close()


def test_an_expired_statement_link_is_refused_with_a_reason(live_server, settings, db):
    past = datetime.now(UTC) - timedelta(seconds=1)
    token = links.sign(settings.key_pepper, links.StatementGrant("acme", "cust-1", PERIOD, past))
    reply = httpx.get(f"{live_server}/v1/statement-links/{token}", timeout=30)
    assert reply.status_code == 403
    assert "expired" in reply.json()["detail"]
