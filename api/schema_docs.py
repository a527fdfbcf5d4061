"""``/schema``: the API's docs page, served whole from this process, with no CDN.

Litestar's default pages load Redoc (and fonts, a favicon) from CDNs, so without internet
``/schema`` was blank ("Redoc is not defined"). The Redoc bundle ships in the
``openapi-ui-bundles`` wheel; the app serves it under :data:`ASSETS_PATH`, and the page itself
has no inline script (Redoc is started by a small script of ours that reads the schema from
``/schema/openapi.json``), so its Content-Security-Policy allows scripts from ourselves only.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from litestar import Request, Response, Router
from litestar.openapi.plugins import RedocRenderPlugin
from litestar.static_files import create_static_files_router
from openapi_ui_bundles import redoc

ASSETS_PATH = "/schema-assets"
OWN_ASSETS = Path(__file__).parent / "schema_assets"

# Redoc styles itself through injected <style> elements (styled-components) and runs its
# search in a worker built from a blob: URL; everything else comes from this origin.
DOCS_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src blob:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


class OfflineRedocPlugin(RedocRenderPlugin):
    """Redoc from our own static files, the page free of inline script."""

    def __init__(self) -> None:
        super().__init__(
            path="/redoc",
            js_url=f"{ASSETS_PATH}/redoc/redoc.standalone.js",
            google_fonts=False,
            favicon=f"<link rel='icon' href='{ASSETS_PATH}/redoc/logo-mini.svg'>",
        )

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        title = html.escape(str(openapi_schema.get("info", {}).get("title", "API")))
        page = f"""<!DOCTYPE html><html><head>
<meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} — API docs</title>{self.favicon}
</head><body><div id="redoc-container" data-spec-url="{self.get_openapi_json_route(request)}"></div>
<script src="{self.js_url}"></script>
<script src="{ASSETS_PATH}/own/start-redoc.js"></script>
</body></html>"""
        return page.encode()

    def receive_router(self, router: Router) -> None:
        super().receive_router(router)
        # Async: a hook set after the router was built is awaited as given.
        router.after_request = _with_docs_csp


async def _with_docs_csp(response: Response[Any]) -> Response[Any]:
    response.headers["content-security-policy"] = DOCS_CSP
    response.headers["x-content-type-options"] = "nosniff"
    return response


def schema_assets_router() -> Router:
    """The Redoc bundle (from its wheel) and our start script, cacheable, at ASSETS_PATH."""
    return Router(
        ASSETS_PATH,
        route_handlers=[
            create_static_files_router(
                "/redoc", directories=[redoc.static_path], include_in_schema=False
            ),
            create_static_files_router("/own", directories=[OWN_ASSETS], include_in_schema=False),
        ],
        include_in_schema=False,
    )
