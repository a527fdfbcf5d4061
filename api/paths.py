"""Path segments that hold an encoded ``/`` reach their route as one segment.

Ids follow :mod:`metering.ids` and never hold ``/``, but a deployment older than that
grammar may have stored ``org-7/run-1``. Its clients send ``/v1/runs/org-7%2Frun-1``;
the ASGI server decodes the path before routing, the router sees three segments where the
route has two, and the run could not be read, settled or released (404).

So, before routing, :class:`FairmeterApp` rebuilds such a path from ``raw_path`` with each
segment decoded and then escaped again for ``/`` (``%2F``) and ``%`` (``%25``, which makes
the escape exact); after routing, :func:`decode_path_params` decodes the path parameters
of that request once. A path without an encoded slash is left exactly as the
server decoded it, so every other request routes as before.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from litestar import Litestar
from litestar.types import ASGIApp, Receive, Scope, Send

# Set on a scope whose path kept some escapes, so only those get decoded after routing.
KEPT_ESCAPES = "fairmeter.kept_escapes"


def _escape(segment: str) -> str:
    return segment.replace("%", "%25").replace("/", "%2F")


def keep_encoded_slashes(scope: dict[str, Any]) -> None:
    """Rewrite ``scope["path"]`` so each raw segment stays one segment (see the module)."""
    raw = scope.get("raw_path")
    if not raw or b"%2f" not in raw.lower():
        return
    try:
        segments = [unquote(part) for part in raw.decode("ascii").split("/")]
    except UnicodeDecodeError:
        return
    # Only when the server's path is exactly the decoded raw path; else someone (a proxy
    # prefix, a mount) changed it, and the server's path is the one to trust.
    if "/".join(segments) != scope.get("path") or not any("/" in s for s in segments):
        return
    scope["path"] = "/".join(_escape(s) for s in segments)
    scope[KEPT_ESCAPES] = True


def decode_path_params(app: ASGIApp) -> ASGIApp:
    """Middleware (runs after routing): the kept escapes of string path parameters, decoded."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get(KEPT_ESCAPES):
            scope["path_params"] = {
                name: unquote(value) if isinstance(value, str) else value
                for name, value in scope["path_params"].items()
            }
        await app(scope, receive, send)

    return middleware


class FairmeterApp(Litestar):
    """Litestar, with encoded slashes kept inside their path segment before routing."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            keep_encoded_slashes(scope)
        await super().__call__(scope, receive, send)
