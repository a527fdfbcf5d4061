"""No id can break a response or reach a spreadsheet or a page as something it is not
(issue #13 §5): the CSV's Content-Disposition follows RFC 6266, its cells OWASP's
CSV-injection rule, and every HTML page sends a Content-Security-Policy its own styles meet.

Hostile ids come from a deployment older than the id grammar (seeded below ingest
validation, as it stored them then), through the real server where the HTTP layer matters.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.statements import attachment
from metering.db import raw_transaction
from metering.statements.render import csv_text
from metering.webhooks.delivery import Attempt, claim, record
from metering.webhooks.fanout import fan_out_pending
from tests.helpers.events import auth
from tests.helpers.webhooks import add_endpoint, notify
from tests.security.reach import csrf_of, seed_legacy_run, segment, sign_in_to_console

pytestmark = pytest.mark.timeout(180)


# OWASP's list of the first characters that make a spreadsheet evaluate a cell.
OWASP_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def statement_url(base: str, customer: str, suffix: str = "") -> str:
    return f"{base}/v1/customers/{segment(customer)}/statements/current{suffix}"


# RFC 6266's grammar: disposition-type *( ";" disposition-parm ), a value a token or a
# quoted-string.
PARAM = r'\s*;\s*([A-Za-z0-9!#$&+.^_`|~*-]+)=("(?:[^"\\]|\\.)*"|[^;\s"]+)'


def disposition(value: str) -> dict[str, str]:
    """The parameters of a Content-Disposition value; the whole value must parse, once."""
    assert re.fullmatch(f"attachment(?:{PARAM})*", value), value
    params = re.findall(PARAM, value)
    assert len({name for name, _ in params}) == len(params), value
    return {name: raw.strip('"') for name, raw in params}


@pytest.mark.parametrize(
    ("customer", "fallback"),
    [
        ("c\r\nd", "statement-c__d-"),
        ('a"b; filename=evil.exe', "statement-a_b__filename_evil.exe-"),
        ("müller gmbh", "statement-m_ller_gmbh-"),
        ("org/7", "statement-org_7-"),
    ],
)
def test_the_csv_download_names_any_customer_safely(
    live_server, engine, settings, make_key, customer, fallback
):
    seed_legacy_run(engine, settings, tenant="legacy", run="run-1", customer=customer)
    support = make_key(tenant="legacy", scope="support")
    settled = httpx.post(f"{live_server}/v1/support/runs/run-1/settle", headers=auth(support))
    assert settled.status_code == 200, settled.text
    reply = httpx.get(statement_url(live_server, customer, ".csv"), headers=auth(support))
    assert reply.status_code == 200, reply.text
    value = reply.headers["content-disposition"]
    assert value.startswith("attachment;")
    params = disposition(value)
    assert set(params) == {"filename", "filename*"}, value  # nothing injected
    assert params["filename"].startswith(fallback) and params["filename"].isascii()
    assert params["filename*"].startswith("UTF-8''")
    exact = unquote(params["filename*"].removeprefix("UTF-8''"))
    assert exact.startswith("statement-" + re.sub(r"[/\r\n]", "_", customer) + "-")
    [row] = csv.DictReader(io.StringIO(reply.text))
    assert row["run"] == "run-1"


@given(st.text(max_size=60))
def test_content_disposition_holds_one_file_name_whatever_the_id(name):
    value = attachment(f"statement-{name}-2026-11.csv")
    value.encode("latin-1")  # a valid header value ...
    assert not re.search(r"[\x00-\x1f\x7f]", value)  # ... on one line
    params = disposition(value)
    assert set(params) == {"filename", "filename*"}
    assert re.fullmatch(r"[A-Za-z0-9._-]+", params["filename"])
    named = unquote(params["filename*"].removeprefix("UTF-8''"))
    expected = "".join(c if c.isprintable() and c not in "/\\" else "_" for c in name)
    assert named == f"statement-{expected}-2026-11.csv"


FORMULAS = ["=cmd|' /C calc'!A0", "+1+cmd", "-2+3", "@SUM(A1)", "\t=1", "\r=1"]


def test_csv_cells_a_spreadsheet_would_evaluate_are_neutralised(client, engine, settings, make_key):
    for run in FORMULAS:
        seed_legacy_run(engine, settings, tenant="legacy", run=run, customer="cust-1")
    support = make_key(tenant="legacy", scope="support")
    for run in FORMULAS:
        client.post(f"/v1/support/runs/{segment(run)}/settle", headers=auth(support))
    reply = client.get(statement_url("", "cust-1", ".csv"), headers=auth(support))
    assert reply.status_code == 200, reply.text
    rows = list(csv.DictReader(io.StringIO(reply.text)))
    assert sorted(row["run"] for row in rows) == sorted("'" + run for run in FORMULAS)
    for row in rows:
        for column, cell in row.items():
            assert not cell.startswith(OWASP_FORMULA_STARTS) or column.endswith(("micros", "usd"))
    # Every cell quoted: where ";" separates cells, "a;=1" stays one text cell.
    quoted = io.StringIO()
    csv.writer(quoted, quoting=csv.QUOTE_ALL).writerows(csv.reader(io.StringIO(reply.text)))
    assert reply.text == quoted.getvalue()


@given(st.text(max_size=40))
def test_a_csv_text_cell_reads_back_as_text(value):
    buffer = io.StringIO()
    csv.writer(buffer, quoting=csv.QUOTE_ALL).writerow([csv_text(value)])
    [cell] = next(csv.reader(io.StringIO(buffer.getvalue(), newline="")))
    assert not cell.startswith(OWASP_FORMULA_STARTS)
    assert cell in (value, "'" + value)


def assert_strict_csp(reply: Any, what: str) -> None:
    """A CSP without 'unsafe-inline', whose nonce every <style> block of the page carries,
    and no style="" attribute (which no nonce can allow)."""
    assert reply.headers.get("content-type", "").startswith("text/html"), what
    policy = reply.headers.get("content-security-policy", "")
    assert "default-src 'none'" in policy, f"{what}: {policy!r}"
    assert "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy, what
    nonce = re.search(r"style-src 'nonce-([A-Za-z0-9_-]{16,})'", policy)
    assert nonce, f"{what}: {policy!r}"
    styles = re.findall(r"<style([^>]*)>", reply.text)
    assert styles, what
    assert all(f'nonce="{nonce.group(1)}"' in attributes for attributes in styles), what
    assert not re.search(r"<[^>]+\sstyle=", reply.text), what
    assert "<script" not in reply.text, what
    assert_safe_page_headers(reply, what)


def assert_safe_page_headers(reply: Any, what: str) -> None:
    """The rest of what every HTML page sends: no framing, no sniffing, no referrer beyond
    ourselves, never cached (a console page shows a tenant's data to whoever holds it)."""
    headers = reply.headers
    assert headers.get("x-frame-options") == "DENY", what
    assert headers.get("x-content-type-options") == "nosniff", what
    assert headers.get("referrer-policy") == "same-origin", what
    assert headers.get("cache-control") == "no-store", what


def test_every_html_page_sends_a_strict_content_security_policy(
    live_server, engine, settings, make_key
):
    seed_legacy_run(engine, settings, tenant="legacy", run="run-1", customer="cust-1")
    support = make_key(tenant="legacy", scope="support")
    with httpx.Client(base_url=live_server, timeout=30) as client:
        assert_strict_csp(client.get("/console/login"), "login")
        sign_in_to_console(client, "", support)
        pages = {
            "statement": client.get(
                "/v1/customers/cust-1/statements/current.html", headers=auth(support)
            ),
            "queue": client.get("/console"),
            "run": client.get("/console/runs/run-1"),
            "audit": client.get("/console/audit"),
            "missing run": client.get("/console/runs/no-such-run"),
        }
        pages["confirm"] = client.post(
            "/console/runs/run-1/dispute",
            data={"csrf": csrf_of(pages["run"].text), "claim": "it stopped"},
        )
        pages["expired form"] = client.post("/console/runs/run-1/dispute", data={"claim": "x"})
        for what, reply in pages.items():
            assert_strict_csp(reply, what)
    first, second = (httpx.get(f"{live_server}/console/login") for _ in range(2))
    assert first.headers["content-security-policy"] != second.headers["content-security-policy"]


# A receiver's reply, shown in the delivery log: whatever the tenant's server answered.
HOSTILE_REPLY = '</td></tr><script>alert(1)</script><style>body{display:none}</style><b style="x">'


def seed_delivery_log(engine: Any, settings: Any) -> str:
    """An endpoint (made through the use case) with one message whose attempt the receiver
    answered with markup, recorded as the delivery records it; the endpoint's id."""
    endpoint_id, _ = add_endpoint(engine, settings, "https://hooks.example.com/<b>x</b>")
    notify(engine, "statement.closed", period="2026-11")
    now = datetime.now(UTC)
    fan_out_pending(engine, settings, lambda: now)
    with raw_transaction(engine) as conn:
        [message] = claim(conn, now, 1, timedelta(seconds=30))
        failed = Attempt(now, False, 502, 12, HOSTILE_REPLY, "<i>error</i><script>x</script>")
        record(conn, message, failed, settings)
    return endpoint_id


def test_the_console_webhook_pages_send_the_same_safe_headers(
    live_server, engine, settings, make_key
):
    """Admins' webhook pages (issue #16): the endpoint list, an endpoint's delivery log with
    a receiver's hostile reply in it, and the pages their forms and mistakes lead to."""
    endpoint_id = seed_delivery_log(engine, settings)
    admin = make_key(scope="admin")
    with httpx.Client(base_url=live_server, timeout=30) as client:
        sign_in_to_console(client, "", admin)
        endpoint = client.get(f"/console/webhooks/{endpoint_id}")
        assert endpoint.status_code == 200, endpoint.text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in endpoint.text  # shown, as text
        pages = {
            "endpoints": client.get("/console/webhooks"),
            "delivery log": endpoint,
            "missing endpoint": client.get("/console/webhooks/we_missing"),
            "bad since": client.post(
                f"/console/webhooks/{endpoint_id}/redeliver",
                data={"csrf": csrf_of(endpoint.text), "since": "yesterday"},
            ),
            "expired form": client.post(
                f"/console/webhooks/{endpoint_id}/redeliver", data={"since": "2026-12-01"}
            ),
        }
        assert [r.status_code for r in pages.values()] == [200, 200, 404, 422, 403]
        for what, reply in pages.items():
            assert_strict_csp(reply, what)
        redirect = client.post(
            f"/console/webhooks/{endpoint_id}/redeliver",
            data={"csrf": csrf_of(endpoint.text), "since": "2026-01-01T00:00"},
            follow_redirects=False,
        )
        assert redirect.status_code == 303
        assert_strict_csp(client.get(redirect.headers["location"]), "after redelivery")
    support = make_key(scope="support")
    with httpx.Client(base_url=live_server, timeout=30) as client:
        sign_in_to_console(client, "", support)
        refused = client.get("/console/webhooks")
        assert refused.status_code == 403
        assert_strict_csp(refused, "support key refused")
