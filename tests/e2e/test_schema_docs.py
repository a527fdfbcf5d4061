"""`/schema` renders its docs with no internet (issue #15 §4).

The browser may reach only the served API: every request elsewhere (a CDN, Google Fonts) is
refused, as on a machine offline. The page must still render the API's operations, and say
with a Content-Security-Policy that scripts come from this origin only.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx

WAIT_MS = 30_000


def test_schema_docs_render_offline_from_assets_served_by_the_app(live_server, browser):
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    elsewhere: list[str] = []
    ours = urlsplit(live_server).netloc

    def offline(route: Any) -> None:
        url = route.request.url
        if url.startswith(("data:", "blob:")) or urlsplit(url).netloc == ours:
            route.continue_()
        else:
            elsewhere.append(url)
            route.abort("internetdisconnected")

    context.route("**/*", offline)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.goto(f"{live_server}/schema")
        # Redoc rendered the operations of the document it fetched from /schema/openapi.json.
        page.get_by_text("/v1/events").first.wait_for()
        assert page.locator("h1").first.inner_text().startswith("Fairmeter")
    finally:
        context.close()
    assert not errors, errors
    assert not elsewhere, f"the docs page reached outside the app: {elsewhere}"


def test_schema_docs_page_allows_scripts_from_this_origin_only(live_server):
    page = httpx.get(f"{live_server}/schema", timeout=30)
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy.split("script-src", 1)[1].split(";", 1)[0]
    assert "<script>" not in page.text  # no inline script for the policy to allow
    assert "https://" not in page.text and "http://" not in page.text
