"""Sending one batch to ``POST /v1/events`` and sorting the reply into what to do next."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import Enum
from typing import Any

import httpx

BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"
USER_AGENT = "fairmeter-client/1"
# Statuses that say "not now" (besides every 5xx): the batch is sent again after a backoff.
RETRYABLE = frozenset({408, 425, 429})
# Statuses that say "not you": the key, its scope or the URL is wrong for every event.
CONFIGURATION = frozenset({401, 403, 404, 405})
MAX_RETRY_AFTER_S = 600.0


class Verdict(Enum):
    DELIVERED = "delivered"  # 2xx: committed on the server
    RETRY = "retry"  # network error, 408/425/429/5xx: send again later
    SPLIT = "split"  # 413: too big; send the halves
    REJECTED = "rejected"  # other 4xx (422, 409, 400…): isolate the bad event(s)
    CONFIGURATION = "configuration"  # 401/403/404/405/3xx: stop sending, keep everything


@dataclass(frozen=True, slots=True)
class Reply:
    verdict: Verdict
    status: int | None = None
    accepted: int = 0
    duplicates: int = 0
    retry_after_s: float | None = None
    problem: dict[str, Any] = field(default_factory=dict)

    @property
    def code(self) -> str:
        return str(self.problem.get("code", f"http_{self.status}"))

    @property
    def detail(self) -> str:
        return str(self.problem.get("detail", ""))


class Transport:
    """An httpx client bound to one API and key. Not thread-safe: the flusher owns it."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = 10.0,
        http_client: httpx.Client | None = None,
    ) -> None:
        self._url = base_url.rstrip("/") + "/v1/events"
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": BATCH_CONTENT_TYPE,
            "User-Agent": USER_AGENT,
        }
        self._owns_client = http_client is None
        self._client = http_client or httpx.Client(timeout=timeout_s)

    def send(self, bodies: list[str]) -> Reply:
        """POST the events (already JSON text) as one batch; never raises for HTTP trouble."""
        content = ("[" + ",".join(bodies) + "]").encode()
        try:
            response = self._client.post(self._url, content=content, headers=self._headers)
        except httpx.HTTPError as exc:  # connect errors, timeouts, dropped connections
            return Reply(Verdict.RETRY, problem={"code": "network_error", "detail": repr(exc)})
        return classify(response)

    def close(self) -> None:
        if self._owns_client:
            self._client.close()


def classify(response: httpx.Response) -> Reply:
    status = response.status_code
    body = _json(response)
    if 200 <= status < 300:
        return Reply(
            Verdict.DELIVERED,
            status,
            accepted=int(body.get("accepted", 0)),
            duplicates=int(body.get("duplicates", 0)),
        )
    problem = body or {"code": f"http_{status}", "detail": response.text[:500]}
    if status in RETRYABLE or status >= 500:
        retry_after = retry_after_s(response.headers.get("retry-after"))
        return Reply(Verdict.RETRY, status, retry_after_s=retry_after, problem=problem)
    if status == 413:
        return Reply(Verdict.SPLIT, status, problem=problem)
    if status in CONFIGURATION or status < 400:  # 3xx: the base URL points elsewhere
        return Reply(Verdict.CONFIGURATION, status, problem=problem)
    return Reply(Verdict.REJECTED, status, problem=problem)


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return body if isinstance(body, dict) else {}


def retry_after_s(header: str | None) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date; ``None`` when absent/bad."""
    if not header:
        return None
    header = header.strip()
    if header.isdigit():
        return min(float(header), MAX_RETRY_AFTER_S)
    try:
        moment = parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return min(max(0.0, (moment - datetime.now(UTC)).total_seconds()), MAX_RETRY_AFTER_S)


class Backoff:
    """Exponential backoff with "equal jitter": half the delay fixed, half random.

    Jitter keeps many clients that lost the API at once from retrying in lockstep; the
    fixed half keeps a retry from following a failure immediately.
    """

    def __init__(self, base_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self, retry_after: float | None = None) -> float:
        self.failures += 1
        ceiling = min(self.max_s, self.base_s * 2.0 ** min(self.failures - 1, 30))
        delay = ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        if retry_after is not None:  # the server knows best; never retry earlier than asked
            delay = max(delay, retry_after)
        return delay

    def reset(self) -> None:
        self.failures = 0
