"""Prometheus metrics. Multi-process safe when PROMETHEUS_MULTIPROC_DIR is set by `serve`."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from litestar.types import ASGIApp, Receive, Scope, Send
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client import values as prometheus_values
from prometheus_client.core import GaugeMetricFamily

EVENTS = Counter("fairmeter_events_total", "Ingested events by result", ["result", "code"])
REQUEST_LATENCY = Histogram(
    "fairmeter_request_seconds",
    "HTTP request latency",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
# Spans of POST /v1/traces by what became of them (docs/otlp.md): a backend whose spans are
# ignored or rejected is metered short, and this is where an operator sees it.
OTLP_SPANS = Counter(
    "fairmeter_otlp_spans_total",
    "Spans received on POST /v1/traces by result (accepted, duplicate, ignored, rejected)",
    ["result", "reason"],
)
KEY_LOOKUPS = Counter(
    "fairmeter_key_lookups_total",
    "API key lookups that read the database (cache misses), by whether the key id exists",
    ["result"],
)


# Open live status streams of this process, summed at scrape over the worker processes still
# alive (``forget_dead_processes``): a killed worker's streams died with it.
STREAMS_OPEN = Gauge(
    "fairmeter_streams_open", "Open live status streams", multiprocess_mode="livesum"
)
STREAM_LISTENER_RECONNECTS = Counter(
    "fairmeter_stream_listener_reconnects_total",
    "Times a process's LISTEN connection for the live streams was lost and made again",
)
STREAM_CATCH_UPS = Counter(
    "fairmeter_stream_catch_ups_total",
    "Times a live stream read missed notifications back from the table (slow client, lost "
    "listener, resume)",
)


def record_key_lookup(*, found: bool) -> None:
    KEY_LOOKUPS.labels("found" if found else "unknown").inc()


def record_ingest(accepted: int, duplicates: int) -> None:
    if accepted:
        EVENTS.labels("accepted", "").inc(accepted)
    if duplicates:
        EVENTS.labels("duplicate", "").inc(duplicates)


def record_rejection(count: int, code: str) -> None:
    EVENTS.labels("rejected", code).inc(count)


def record_spans(result: str, reason: str, count: int) -> None:
    if count:
        OTLP_SPANS.labels(result, reason).inc(count)


def render_metrics(
    outbox_counts: dict[str, int],
    rejected_by_code: dict[str, int] | None = None,
    awaiting_reconciliation: int = 0,
) -> tuple[bytes, str]:
    """Process metrics plus gauges read from the database at scrape time (shared state, so
    every API process reports the same numbers, e.g. the Stripe dead letter)."""
    if prometheus_values.ValueClass.__name__ == "MmapedValue":  # multi-process mode
        # prometheus_client's own variable (api/server.py sets it for `serve --workers`).
        forget_dead_processes(Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        body = generate_latest(registry)
    else:
        body = generate_latest()
    gauges = CollectorRegistry()
    gauges.register(
        _OutboxCollector(outbox_counts, rejected_by_code or {}, awaiting_reconciliation)
    )
    return body + generate_latest(gauges), CONTENT_TYPE_LATEST


PROC = Path("/proc")
LIVE_GAUGE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db")


def forget_dead_processes(metrics_dir: Path) -> list[int]:
    """Drop the live-gauge files (``multiprocess_mode="live…"``, such as the open streams) of
    worker processes that no longer run; their pids. A worker that exits or is SIGKILLed
    never decrements its share, and uvicorn's supervisor has no child-exit hook to call
    prometheus_client's ``mark_process_dead`` from (gunicorn's ``child_exit`` is where its
    docs put it), so each scrape does it. The directory is this host's, so are the pids."""
    dead = sorted(
        {
            int(found.group(1))
            for path in metrics_dir.iterdir()
            if (found := LIVE_GAUGE_FILE.fullmatch(path.name)) and not _running(int(found.group(1)))
        }
    )
    for pid in dead:
        multiprocess.mark_process_dead(pid, str(metrics_dir))  # type: ignore[no-untyped-call]
    return dead


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that still runs (a zombie, killed but not yet reaped by
    its parent, does not)."""
    if not PROC.is_dir():  # no /proc: ask the kernel whether the pid exists at all
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class _OutboxCollector:
    def __init__(self, counts: dict[str, int], rejected: dict[str, int], awaiting: int) -> None:
        self._counts = counts
        self._rejected = rejected
        self._awaiting = awaiting

    def collect(self) -> Any:
        family = GaugeMetricFamily(
            "fairmeter_stripe_outbox_rows", "Stripe outbox rows by status", labels=["status"]
        )
        for status in ("pending", "waiting_customer", "sent", "dead", "superseded"):
            family.add_metric([status], self._counts.get(status, 0))
        yield family
        rejected = GaugeMetricFamily(
            "fairmeter_stripe_meter_events_rejected",
            "Meter events Stripe accepted, then rejected in an error report, by error code",
            labels=["code"],
        )
        for code, count in sorted(self._rejected.items()):
            rejected.add_metric([code], count)
        yield rejected
        yield GaugeMetricFamily(
            "fairmeter_stripe_outbox_awaiting_reconciliation",
            "Pending rows past their idempotency window that wait for Stripe's summaries to be "
            "trusted, or that the summaries do not explain (an operator looks: docs/stripe.md)",
            value=self._awaiting,
        )


def latency_middleware(app: ASGIApp) -> ASGIApp:
    """Times every HTTP request, labelled by route template (bounded label cardinality)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # type: ignore[comparison-overlap]
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        status_holder: dict[str, Any] = {"status": 500}

        async def send_wrapper(message: Any) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
            await send(message)

        try:
            await app(scope, receive, send_wrapper)
        finally:
            route = scope.get("path_template") or "unmatched"
            REQUEST_LATENCY.labels(
                scope.get("method", "?"), route, str(status_holder["status"])
            ).observe(time.perf_counter() - started)

    return middleware
