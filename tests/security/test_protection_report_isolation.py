"""The cost of protection report answers each admin with its own tenant only.

The IDOR matrix (test_idor_matrix.py) calls ``GET /v1/reports/protection`` with every key of
another tenant and every wrong scope, from the OpenAPI document; this adds the control it
cannot make for a route without a path parameter: with two seeded tenants, each admin's JSON,
CSV and console page hold its own customer and never the other's.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers.events import auth
from tests.security.harness import seed_tenant

pytestmark = pytest.mark.timeout(120)


def console_page(client, key: str, period: str) -> str:
    form = client.get("/console/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert nonce, form.text[:300]
    client.post(
        "/console/login",
        data={"csrf": nonce.group(1), "key": key, "next": "/console"},
        follow_redirects=False,
    )
    page = client.get("/console/protection", params={"period": period})
    client.cookies.clear()
    assert page.status_code == 200, page.text[:300]
    return str(page.text)


def test_each_admin_sees_its_own_tenants_report_and_nothing_of_the_other(
    client, engine, settings, db, make_key
):
    tenants = {t: seed_tenant(engine, settings, tenant=t) for t in ("acme", "globex")}
    # The month the seeded runs ended in (not always this month: they end 3 hours ago).
    (period,) = db.execute("SELECT DISTINCT period FROM runs").fetchone()
    for tenant, data in tenants.items():
        other = next(d for t, d in tenants.items() if t != tenant)
        key = make_key(tenant=tenant, scope="admin")
        replies = [
            client.get("/v1/reports/protection", params={"period": period}, headers=auth(key)),
            client.get(
                "/v1/reports/protection",
                params={"period": period, "format": "csv"},
                headers=auth(key),
            ),
        ]
        texts = [r.text for r in replies if r.status_code == 200]
        texts.append(console_page(client, key, period))
        assert len(texts) == 3
        for text in texts:
            assert data.customer in text
            assert not [m for m in other.markers if m in text], tenant
        assert replies[0].json()["tenant"] == tenant
