"""The support console in headless Chromium: sign-in, queue, timeline, disputes, audit, CSRF."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest

from api.console import session
from api.console.forms import usd_to_micros
from metering.errors import MeteringError
from metering.money import display_usd, format_usd
from metering.settlement.runner import settle_due_now
from tests.e2e.conftest import WAIT_MS
from tests.helpers.events import event, usage
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import scenario

NOW = datetime.now(UTC)


def large_run(run: str, customer: str, start: datetime, *, resumed: bool = False) -> list[Any]:
    """A run big enough for whole dollars: two steps on the large model, then a delivery.

    ``resumed`` adds a checkpoint, a client-side drop and a resume with a replayed step, so
    the timeline shows every kind of marker."""

    def at(minutes: float) -> datetime:
        return start + timedelta(minutes=minutes)

    def e(type_: str, minute: float, **data: Any) -> dict[str, Any]:
        return event(type=type_, run=run, customer=customer, time=at(minute), **data)

    def u(step: int, minute: float, **data: Any) -> dict[str, Any]:
        return usage(
            run=run,
            customer=customer,
            step=step,
            time=at(minute),
            input_tokens=1_000_000,
            output_tokens=2_000_000,
            **data,
        )

    events = [
        e("run.started", 0, attempt=1),
        u(1, 1),
        e("run.checkpoint", 1.5, checkpoint_id="cp-1", step=1),
    ]
    if resumed:
        events += [
            e("connection.lost", 2, side="client", reason="laptop slept"),
            e("run.resumed", 4, attempt=2, from_checkpoint="cp-1"),
            u(2, 5, attempt=2),
            u(2, 5.5, attempt=2, replay=True),
        ]
    else:
        events.append(u(2, 2))
    return [*events, e("run.delivered", 6, step=2, kind="final"), e("run.completed", 6.5)]


@pytest.fixture
def runs(engine, settings, db) -> dict[str, str]:
    """Settled runs: refunded, confirmed (66 USD), held and resumed. Names are unique per
    test so that audit rows left by earlier tests cannot be mistaken for this test's."""
    tag = uuid.uuid4().hex[:6]
    names = {kind: f"{kind}-{tag}" for kind in ("refunded", "confirmed", "held", "resumed")}
    start = NOW - timedelta(hours=2)
    events = [
        *scenario("server-drop", names["refunded"], "cust-1", start),
        *large_run(names["confirmed"], "cust-2", start + timedelta(minutes=5)),
        *scenario("client-claim", names["held"], "cust-1", start + timedelta(minutes=10)),
        *large_run(names["resumed"], "cust-3", start + timedelta(minutes=15), resumed=True),
    ]
    ingest(engine, settings, events)
    settle_due_now(engine, settings, now=NOW)
    outcomes = dict(db.execute("SELECT subject, outcome FROM runs").fetchall())
    assert outcomes[names["refunded"]] == "refunded"
    assert outcomes[names["confirmed"]] == "confirmed"
    assert outcomes[names["held"]] == "held_for_review"
    return names


def sign_in(page: Any, base: str, key: str) -> None:
    page.goto(f"{base}/console/login")
    page.fill("#key", key)
    page.click("#sign-in")
    page.wait_for_url(f"{base}/console")


def test_support_key_signs_in_to_the_queue_and_sees_a_dropped_runs_timeline(
    live_server, page, make_key, runs, db, artifacts
):
    sign_in(page, live_server, make_key(scope="support"))
    held = page.locator("#queue-held")
    assert held.locator(f'tr[data-run="{runs["held"]}"]').is_visible()
    held_runs = db.execute("SELECT count(*) FROM runs WHERE outcome = 'held_for_review'")
    assert page.locator("#count-held").inner_text() == str(held_runs.fetchone()[0])
    assert page.locator("#scope").inner_text() == "support"
    page.screenshot(path=str(artifacts / "console-queue.png"), full_page=True)

    page.fill("#q", "refunded-")
    page.select_option("#outcome", "refunded")
    page.click("#search-button")
    page.wait_for_url("**/console?q=refunded-*")
    found = page.locator(f'#results tr[data-run="{runs["refunded"]}"]')
    assert found.is_visible()
    assert page.locator("#results tbody tr").count() == 1
    found.locator("a").click()
    page.wait_for_url(f"**/console/runs/{runs['refunded']}")

    drop = page.locator('svg.timeline [data-kind="connection.lost"]')
    assert drop.is_visible()
    assert drop.get_attribute("data-side") == "server"
    assert "Connection lost, server-side" in (drop.locator("title").text_content() or "")
    assert page.locator('svg.timeline [data-kind="run.usage"]').count() == 2
    assert page.locator('svg.timeline [data-kind="run.failed"]').is_visible()
    assert page.locator('svg.timeline [data-kind="interruption"]').count() == 1
    assert page.locator("#run-status").inner_text() == "Run failed — usage restored"
    assert page.locator("#money-billed").inner_text() == "0.00"
    assert page.locator("#explanation .explanation").inner_text().strip()
    page.screenshot(path=str(artifacts / "console-timeline.png"), full_page=True)

    page.goto(f"{live_server}/console/runs/{runs['resumed']}")
    for kind in ("run.checkpoint", "run.resumed", "run.delivered", "run.completed"):
        assert page.locator(f'svg.timeline [data-kind="{kind}"]').is_visible(), kind
    client_drop = page.locator('svg.timeline [data-kind="connection.lost"]')
    assert client_drop.get_attribute("data-side") == "client"
    page.screenshot(path=str(artifacts / "console-timeline-resumed.png"), full_page=True)


def test_support_opens_a_dispute_and_approves_a_partial_credit_after_confirming(
    live_server, page, make_key, runs, db, settings, artifacts
):
    run = runs["confirmed"]
    billed = db.execute("SELECT billed_micros FROM runs WHERE subject = %s", (run,)).fetchone()[0]
    assert billed > settings.support_credit_limit_micros  # so a full credit needs an admin
    credit = 12_345_678  # 12.345678 USD, typed in full
    sign_in(page, live_server, make_key(scope="support"))
    page.goto(f"{live_server}/console/runs/{run}")
    assert page.locator("#money-billed").inner_text() == format_usd(billed)

    page.fill("#claim", "The agent repeated two steps after my laptop slept.")
    page.click("#dispute-review")
    assert "open a dispute on run" in page.locator("#confirm-summary").inner_text()
    assert db.execute("SELECT count(*) FROM disputes").fetchone()[0] == 0  # not yet
    page.click("#confirm-yes")
    page.wait_for_url(f"**/console/runs/{run}")
    assert "opened" in page.locator("#flash").inner_text()

    # A full credit is above a support key's limit: the confirm page warns, and confirming
    # anyway is refused with a message on the run page, not an error document.
    page.check("#credit-full")
    page.fill("#approve-reason", "Refunding the whole run.")
    page.click("#approve-review")
    assert "need an admin key" in page.locator("#confirm").inner_text()
    page.click("#confirm-yes")
    assert "Nothing was changed" in page.locator("#flash").inner_text()
    assert "need an admin" in page.locator("#flash").inner_text()
    assert page.locator("#money-billed").inner_text() == format_usd(billed)
    assert page.locator("#approve-reason").input_value() == "Refunding the whole run."

    page.check("#credit-amount")
    page.fill("#amount_usd", str(Decimal(credit) / 1_000_000))
    page.fill("#approve-reason", "Two steps were repeated; crediting them.")
    page.click("#approve-review")
    summary = page.locator("#confirm-summary").inner_text()
    assert f"You are about to credit {format_usd(credit)} USD (exactly 12.345678 USD)" in summary
    assert run in summary
    page.screenshot(path=str(artifacts / "console-confirm.png"), full_page=True)
    resubmit = _form_fields(page, "#confirm form")
    page.click("#confirm-yes")
    page.wait_for_url(f"**/console/runs/{run}")

    assert "approved" in page.locator("#flash").inner_text()
    assert page.locator("#money-billed").inner_text() == format_usd(billed - credit)
    assert page.locator("#money-credited").inner_text() == format_usd(credit)
    assert page.locator("#run-outcome").inner_text() == "partially credited"
    assert page.locator('#disputes [data-status="approved"]').is_visible()

    # Sending the confirmed form again (a double click, a reload) changes nothing: a 409,
    # shown as a message on the run page rather than an error document.
    again = page.request.post(f"{live_server}/console/runs/{run}/approve", form=resubmit)
    assert again.status == 409
    assert "already approved" in again.text()
    approvals = db.execute(
        "SELECT count(*) FROM audit_log WHERE target_id = %s AND action = 'dispute.approve'",
        (run,),
    ).fetchone()[0]
    assert approvals == 1

    page.click("text=Audit log")
    page.wait_for_url("**/console/audit")
    row = page.locator(f'#audit tr[data-action="dispute.approve"][data-target="{run}"]')
    assert row.is_visible()
    assert f"credit {format_usd(credit)} USD" in row.inner_text()
    assert page.locator(f'#audit tr[data-action="dispute.open"][data-target="{run}"]').count() == 1
    page.screenshot(path=str(artifacts / "console-audit.png"), full_page=True)


def _form_fields(page: Any, selector: str) -> dict[str, str]:
    return dict(
        page.eval_on_selector(
            selector, "f => Array.from(new FormData(f).entries()).map(([k, v]) => [k, String(v)])"
        )
    )


def test_a_wrong_key_cannot_sign_in(live_server, page, make_key):
    key = make_key(scope="support")
    page.goto(f"{live_server}/console/login")
    page.fill("#key", key[:-3] + ("000" if not key.endswith("000") else "111"))
    page.click("#sign-in")
    assert page.locator("#login-error").is_visible()
    assert page.url.startswith(f"{live_server}/console/login")
    assert not [c for c in page.context.cookies() if c["name"] == "fm_console"]


@pytest.mark.parametrize("scope", ["customer", "ingest"])
def test_customer_and_ingest_keys_cannot_sign_in(live_server, page, make_key, scope):
    key = make_key(scope=scope, customer="cust-1" if scope == "customer" else None)
    page.goto(f"{live_server}/console/login")
    page.fill("#key", key)
    page.click("#sign-in")
    assert f"This is a {scope} key" in page.locator("#login-error").inner_text()
    page.goto(f"{live_server}/console")
    assert page.url.startswith(f"{live_server}/console/login")


def test_the_console_sends_visitors_without_a_session_to_sign_in(live_server, page, db):
    for path in ("/console", "/console/audit", "/console/runs/anything", "/console/webhooks"):
        reply = httpx.get(f"{live_server}{path}", follow_redirects=False, timeout=10)
        assert reply.status_code == 303, path
        assert reply.headers["location"].startswith("/console/login")
    forged = httpx.get(f"{live_server}/console", cookies={"fm_console": "e30.forged"}, timeout=10)
    assert forged.status_code == 303
    page.goto(f"{live_server}/console")
    assert page.url.startswith(f"{live_server}/console/login")
    assert page.locator("#key").is_visible()


def test_a_post_without_the_csrf_token_is_refused(live_server, page, make_key, runs, db):
    sign_in(page, live_server, make_key(scope="support"))
    url = f"{live_server}/console/runs/{runs['confirmed']}/dispute"
    forged = {"claim": "forged", "confirm": "yes"}
    for form in (forged, forged | {"csrf": "not-the-token"}):
        reply = page.request.post(url, form=form)
        assert reply.status == 403
        assert "nothing was changed" in reply.text()
    assert db.execute("SELECT count(*) FROM disputes").fetchone()[0] == 0


# The pure pieces under the pages: no browser needed, so they cost nothing here.


@pytest.mark.parametrize(
    ("typed", "micros"),
    [("1.23", 1_230_000), ("$0.000001", 1), ("12.345678", 12_345_678), (" 7 ", 7_000_000)],
)
def test_usd_typed_in_the_console_becomes_exact_micros(typed, micros):
    assert usd_to_micros(typed) == micros


@pytest.mark.parametrize("typed", ["1.2345678", "1,23", "-1", "0", "abc", "NaN", "Infinity", ""])
def test_usd_the_console_refuses_rather_than_rounds(typed):
    with pytest.raises(MeteringError) as refused:
        usd_to_micros(typed)
    assert refused.value.status == 422


def test_a_csrf_token_is_bound_to_its_session_and_the_pepper():
    # The sessions themselves are server-side: tests/security/test_console_sessions.py.
    token, other = "session-token-one", "session-token-two"
    assert session.csrf_matches(token, "pepper", session.csrf_token(token, "pepper"))
    assert not session.csrf_matches(other, "pepper", session.csrf_token(token, "pepper"))
    assert not session.csrf_matches(token, "pepper", session.csrf_token(token, "other-pepper"))
    assert not session.csrf_matches(token, "pepper", None)


def test_console_pages_are_styled_under_their_content_security_policy(
    live_server, page, make_key, runs, db
):
    """The pages' styles carry the CSP nonce: Chromium applies every rule and reports no
    violation, also for the rules that were style="" attributes before the CSP."""
    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text) if "Security Policy" in m.text else None)
    page.goto(f"{live_server}/console/login")
    assert page.locator("body").evaluate("el => getComputedStyle(el).fontSize") == "14px"
    sign_in(page, live_server, make_key(scope="support"))
    page.goto(f"{live_server}/console/runs/{runs['held']}")
    page.fill("#claim", "The agent stopped.")
    page.click("#dispute-review")
    assert page.locator("#confirm").evaluate("el => getComputedStyle(el).maxWidth") == "680px"
    assert page.locator("#confirm-summary").evaluate("el => getComputedStyle(el).fontSize") == (
        "16px"
    )
    page.goto(f"{live_server}/console/audit")
    assert page.locator("form.filter").evaluate("el => getComputedStyle(el).display") == "flex"
    page.goto(f"{live_server}/console/runs/no-such-run")
    assert page.locator("#error").evaluate("el => getComputedStyle(el).maxWidth") == "640px"
    assert violations == []


@pytest.mark.parametrize("width", [1366, 420])
def test_releasing_a_held_run_shows_one_proposal_and_words_that_agree(
    live_server, browser, make_key, runs, db, width
):
    run = runs["held"]
    proposed = db.execute(
        "SELECT d.billed_micros FROM decisions d JOIN runs r ON r.id = d.run_id "
        "WHERE r.subject = %s",
        (run,),
    ).fetchone()[0]
    assert proposed > 0
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        sign_in(page, live_server, make_key(scope="support"))
        page.goto(f"{live_server}/console/runs/{run}")
        # The box and the confirm page name the same figure: the policy's proposal.
        box = page.locator("#release-proposal").inner_text()
        assert f"{display_usd(proposed)} USD billed" in box
        page.fill("#release-reason", "Checked the logs: the client crashed.")
        page.click("#release-review")
        summary = page.locator("#confirm-summary").inner_text()
        assert f"{display_usd(proposed)} USD billed" in summary
        page.click("#confirm-yes")
        page.wait_for_url(f"**/console/runs/{run}")
        words = page.locator("#explanation .explanation").inner_text()
        assert "held for review" not in words and "nothing is billed" not in words
        assert "Support reviewed the run and released the hold." in words
        assert page.locator("#money-billed").inner_text() == display_usd(proposed)
    finally:
        context.close()


CONSOLE_WIDTHS = [1366, 1024, 420]

# Elements wider than their box, or boxes overlapping a table: what a person cannot read.
_OVERFLOWS = """
() => {
  const doc = document.documentElement;
  const found = [];
  if (doc.scrollWidth > doc.clientWidth + 1) found.push('page scrolls sideways');
  for (const el of document.querySelectorAll('main *, body > *')) {
    const style = getComputedStyle(el);
    if (['auto', 'scroll'].includes(style.overflowX)) continue;
    if (el.closest('.scroll')) continue;
    if (el.scrollWidth > el.clientWidth + 1 && style.overflowX === 'hidden' && el.clientWidth > 0)
      found.push('clipped: ' + el.tagName + '#' + el.id + '.' + el.className);
  }
  // What of an element can be seen: its box cut to every ancestor that scrolls or clips.
  const rect = (el) => {
    let r = el.getBoundingClientRect();
    let box = {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width};
    for (let p = el.parentElement; p; p = p.parentElement) {
      if (getComputedStyle(p).overflowX === 'visible') continue;
      const c = p.getBoundingClientRect();
      box = {left: Math.max(box.left, c.left), right: Math.min(box.right, c.right),
             top: Math.max(box.top, c.top), bottom: Math.min(box.bottom, c.bottom)};
      box.width = Math.max(0, box.right - box.left);
    }
    return box;
  };
  const tables = [...document.querySelectorAll('table')];
  for (const card of document.querySelectorAll('.card, section')) {
    for (const table of tables) {
      if (card.contains(table) || table.contains(card)) continue;
      const a = rect(card), b = rect(table);
      if (a.width && b.width && a.left < b.right - 1 && b.left < a.right - 1
          && a.top < b.bottom - 1 && b.top < a.bottom - 1)
        found.push('overlaps a table: ' + card.tagName + '#' + card.id);
    }
  }
  for (const table of tables) {
    if (rect(table).right > doc.clientWidth + 1) found.push('table off screen: ' + table.id);
  }
  return found;
}
"""


def _amounts_never_read_as_zero(page: Any) -> None:
    for amount in page.locator(".usd").all():
        title = amount.get_attribute("title") or ""
        value = int(amount.get_attribute("data-micros") or "x")
        shown = amount.inner_text().replace(",", "")
        assert (float(shown) == 0) == (value == 0), (shown, title)
        assert f"({value:,} micro-USD)" in title


@pytest.mark.parametrize("width", CONSOLE_WIDTHS)
def test_console_pages_fit_and_show_every_credited_micro_at_each_width(
    live_server, browser, make_key, runs, db, artifacts, width
):
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        sign_in(page, live_server, make_key(scope="support"))
        for path in (
            "/console",
            f"/console/runs/{runs['held']}",
            f"/console/runs/{runs['refunded']}",
            f"/console/runs/{runs['confirmed']}",
            "/console/audit",
        ):
            page.goto(f"{live_server}{path}")
            assert page.evaluate(_OVERFLOWS) == [], (path, width)
            _amounts_never_read_as_zero(page)
        page.goto(f"{live_server}/console/runs/{runs['held']}")
        held = page.locator("#money-held").inner_text()
        assert float(held) > 0  # the hold of a held run is never shown as 0.00
        page.screenshot(path=str(artifacts / f"console-run-{width}.png"), full_page=True)
    finally:
        context.close()


def test_every_time_in_the_console_names_its_timezone(live_server, page, make_key, runs):
    sign_in(page, live_server, make_key(scope="support"))
    for path in ("/console", f"/console/runs/{runs['held']}"):
        page.goto(f"{live_server}{path}")
        text = page.locator("main").inner_text()
        times = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: UTC)?", text)
        assert times and all(t.endswith(" UTC") for t in times), (path, times)


def test_support_credits_a_run_from_the_console_without_a_dispute(
    live_server, page, make_key, runs, db
):
    run = runs["confirmed"]
    billed = db.execute("SELECT billed_micros FROM runs WHERE subject = %s", (run,)).fetchone()[0]
    sign_in(page, live_server, make_key(scope="support"))
    page.goto(f"{live_server}/console/runs/{run}")
    page.check("#credit-amount")
    page.fill("#amount_usd", "1.5")
    page.fill("#credit-reason", "Goodwill for a slow run.")
    page.click("#credit-review")
    assert "You are about to credit 1.50 USD" in page.locator("#confirm-summary").inner_text()
    page.click("#confirm-yes")
    page.wait_for_url(f"**/console/runs/{run}")
    assert "credited to run" in page.locator("#flash").inner_text()
    assert page.locator("#money-credited").inner_text() == "1.50"
    assert page.locator("#money-billed").inner_text() == format_usd(billed - 1_500_000)
    audit = db.execute(
        "SELECT count(*) FROM audit_log WHERE target_id = %s AND action = 'run.credit'", (run,)
    ).fetchone()[0]
    assert audit == 1


def test_support_creates_a_statement_link_the_customer_opens_without_a_key(
    live_server, page, make_key, runs, browser
):
    """Issue #15 item 12/13: the console issues the link the API can (support sends it)."""
    run = runs["confirmed"]
    sign_in(page, live_server, make_key(scope="support"))
    page.goto(f"{live_server}/console/runs/{run}")
    page.fill("#statement-period", "current")
    page.click("#statement-link-create")
    url = page.locator("#statement-link-url").input_value()
    assert url.startswith(f"{live_server}/v1/statement-links/")
    assert "cust-2" in page.locator("#statement-link-block").inner_text()

    customer = browser.new_context()  # another person's browser: no session, no key
    try:
        tab = customer.new_page()
        response = tab.goto(url)
        assert response is not None and response.status == 200
        assert "cust-2" in tab.locator("body").inner_text()
    finally:
        customer.close()

    page.fill("#statement-period", "not-a-month")
    page.click("#statement-link-create")
    assert "Nothing was changed" in page.locator("#flash").inner_text()
    assert page.locator("#statement-link-url").count() == 0


def test_the_queue_and_the_api_use_the_same_words_for_a_running_run(
    live_server, page, make_key, engine, settings, db
):
    """Issue #15 item 13: an unsettled run read "not settled" in the console while the API
    said "Agent still running"; the console now shows the API's status and no other word."""
    run = f"running-{uuid.uuid4().hex[:6]}"
    ingest(engine, settings, [event(type="run.started", run=run, customer="cust-9", time=NOW)])
    key = make_key(scope="support")
    status = httpx.get(
        f"{live_server}/v1/runs/{run}", headers={"Authorization": f"Bearer {key}"}
    ).json()["status"]
    sign_in(page, live_server, key)
    page.goto(f"{live_server}/console?q={run}")
    row = page.locator(f"#results tr[data-run='{run}']").inner_text()
    assert status in row
    assert "not settled" not in row.lower()
    page.goto(f"{live_server}/console/runs/{run}")
    assert "not settled" not in page.locator("main").inner_text().lower()
