"""Reporting a workload's runs through the client (``fairmeter_client.Meter``) and its spool."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fairmeter_client import Meter

from tests.reliability.books import Workload


def report(meter: Meter, workload: Workload) -> Workload:
    """Report every event through ``meter`` (same times and data); the events as sent,
    with the client's ids and source, for the oracle."""
    sent = []
    for run, events in workload.by_run().items():
        reporter = meter.run(run, customer=events[0]["data"]["customer"])
        for event in events:
            event_id = _call(reporter, event)
            sent.append({**event, "id": event_id, "source": meter.source})
    return Workload(dict(workload.kinds), sent)


def _call(run: Any, event: dict[str, Any]) -> str:
    at = datetime.fromisoformat(event["time"].replace("Z", "+00:00"))
    data = event["data"]
    match event["type"]:
        case "run.started":
            return str(run.started(at=at))
        case "run.usage":
            return str(
                run.usage(
                    step=data["step"],
                    model=data["model"],
                    input_tokens=data["input_tokens"],
                    output_tokens=data["output_tokens"],
                    cached_input_tokens=data["cached_input_tokens"],
                    at=at,
                )
            )
        case "run.delivered":
            return str(run.delivered(step=data["step"], kind=data["kind"], at=at))
        case "run.completed":
            return str(run.completed(at=at))
        case "run.cancelled":
            return str(run.cancelled(by=data["by"], at=at))
        case "run.failed":
            return str(run.failed(cause=data["cause"], at=at))
        case "connection.lost":
            return str(run.connection_lost(side=data["side"], at=at))
    raise ValueError(event["type"])
