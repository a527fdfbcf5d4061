"""Factories for CloudEvents as agent backends send them (keyword-only, sensible defaults)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

_ids = itertools.count(1)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def event(
    *,
    type: str = "run.usage",
    run: str = "run-1",
    customer: str = "cust-1",
    id: str | None = None,
    source: str = "agent-backend/eu-1",
    time: datetime | None = None,
    **data: Any,
) -> dict[str, Any]:
    """A structured-mode CloudEvent dict."""
    return {
        "specversion": "1.0",
        "id": id or f"evt-{next(_ids)}",
        "source": source,
        "type": type,
        "subject": run,
        "time": iso(time or datetime.now(UTC) - timedelta(seconds=1)),
        "data": {"customer": customer, **data},
    }


def usage(
    *,
    step: int = 1,
    model: str = "agent-large-1",
    input_tokens: int = 1000,
    output_tokens: int = 500,
    cached_input_tokens: int = 0,
    attempt: int = 1,
    **kwargs: Any,
) -> dict[str, Any]:
    return event(
        type="run.usage",
        step=step,
        model=model,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=cached_input_tokens,
        attempt=attempt,
        **kwargs,
    )


STRUCTURED = {"content-type": "application/cloudevents+json"}
BATCH = {"content-type": "application/cloudevents-batch+json"}


def auth(key: str, **headers: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", **headers}
