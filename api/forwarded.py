"""Who the client is: X-Forwarded-For believed from trusted proxies only, and a warning when a
proxy that is not trusted forwards.

The rate limiter counts requests without a valid key per client address. Behind a load
balancer that is not listed in ``FAIRMETER_TRUSTED_PROXIES`` every client has the balancer's
address, so every client shares one anonymous budget: one client's flood of forged keys
refuses the others. Nothing fails loudly in that set-up, so the first request that arrives
with ``X-Forwarded-For`` from a peer we do not trust logs one warning per process, naming the
variable to set.

The rewriting itself is uvicorn's ``ProxyHeadersMiddleware`` (the ASGI scope's ``client``
becomes the forwarded client). It is applied here, around the app, rather than by uvicorn's
``proxy_headers`` option, because only outside it is the connecting peer still visible.
"""

from __future__ import annotations

import logging

from litestar.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

log = logging.getLogger("fairmeter.forwarded")


def trusted_proxies(setting: str) -> list[str]:
    """``FAIRMETER_TRUSTED_PROXIES`` (comma-separated IPs or CIDRs) as a list."""
    return [peer.strip() for peer in setting.split(",") if peer.strip()]


class ForwardedClient:
    """ASGI middleware: the client behind ``trusted`` proxies, a warning about the others."""

    def __init__(self, app: ASGIApp, trusted: list[str]) -> None:
        # litestar's and uvicorn's ASGI type aliases differ in detail, not in what runs.
        proxy = ProxyHeadersMiddleware(app, trusted) if trusted else None  # type: ignore[arg-type]
        self._app: ASGIApp = proxy or app  # type: ignore[assignment]
        self._trusted = proxy.trusted_hosts if proxy else None  # the same rule uvicorn applies
        self._warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._warned and scope["type"] in ("http", "websocket"):
            self._check(scope)
        await self._app(scope, receive, send)

    def _check(self, scope: Scope) -> None:
        if not any(name == b"x-forwarded-for" for name, _ in scope.get("headers", [])):
            return
        client = scope.get("client")
        peer = client[0] if client else None
        if self._trusted is not None and peer in self._trusted:
            return
        self._warned = True
        log.warning(
            "requests arrive with X-Forwarded-For from %s, which FAIRMETER_TRUSTED_PROXIES "
            "does not list: clients behind that proxy share its address's rate limit for "
            "requests without a valid key. List the proxy's address there (IPs or CIDRs). "
            "Logged once per process.",
            peer,
        )
