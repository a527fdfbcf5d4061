"""The HTTP client that delivers webhooks: one request, its status and the start of its
reply, or why there was none. Everything else (which address, which headers, what counts
as delivered) is decided in ``metering/webhooks/delivery.py``.

No redirects (a 3xx is a failed attempt: following one would take the request to a target
nobody checked), no proxies from the environment, a bounded read of the reply.
"""

from __future__ import annotations

import httpx

from metering.webhooks.delivery import Outgoing, Reply

READ_BYTES = 4096  # enough for the 500-character excerpt in any encoding


class WebhookSender:
    """A pooled client per worker process; ``__call__`` is the domain's ``Send``."""

    def __init__(self) -> None:
        self._client = httpx.Client(follow_redirects=False, trust_env=False)

    def __call__(self, request: Outgoing) -> Reply:
        extensions = {"sni_hostname": request.server_name} if request.server_name else {}
        try:
            with self._client.stream(
                "POST",
                request.url,
                content=request.body,
                headers=request.headers,
                timeout=httpx.Timeout(request.timeout_s),
                extensions=extensions,
            ) as response:
                return Reply(response.status_code, _start_of(response))
        except httpx.TimeoutException:
            return Reply(None, error=f"no answer within {request.timeout_s:g} s")
        except httpx.HTTPError as exc:
            return Reply(None, error=f"{type(exc).__name__}: {exc}"[:500])

    def close(self) -> None:
        self._client.close()


def _start_of(response: httpx.Response) -> str:
    """The reply's first bytes as text; a reply that stalls mid-body still counts by its
    status (the receiver has answered)."""
    read = b""
    try:
        for chunk in response.iter_raw():
            read += chunk
            if len(read) >= READ_BYTES:
                break
    except httpx.HTTPError:
        pass
    return read[:READ_BYTES].decode(response.encoding or "utf-8", errors="replace")
