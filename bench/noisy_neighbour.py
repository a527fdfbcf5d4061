"""Noisy-neighbour bench (issue #30 item 5): one tenant's ingest latency next to another
tenant's heaviest requests, in the same run, on the same served API.

On a database of its own (``fairmeter_bench_noisy``, dropped and re-created), one API server
(two uvicorn workers) takes tenant B's steady ingest: ``--connections`` keep-alive clients,
each sending one ``run.usage`` CloudEvent every ``1 / --rate`` seconds (paced, so that what
is measured is B's latency, not how fast B can saturate the machine). Each trial has three
phases of ``--phase-s`` seconds, B's p99 measured in each:

1. **baseline**: B alone;
2. **what-if**: tenant A asks for what-ifs of a period of ``--whatif-runs`` settled runs back
   to back, from ``--heavy-clients`` clients at once (issue #30 used two): the per-tenant
   cap lets one run at a time, the others get 429s and retry after ``Retry-After``;
3. **OTLP**: tenant A exports ``--heavy-clients`` + 1 streams of exports of the largest size
   it may send (``otlp_max_spans_per_request`` GenAI spans with usage, all to one run, as
   issue #30 did), back to back: the cap lets two run at a time.

The figures are the median over ``--trials`` trials of each phase's p99 (one trial's p99 on
a loaded 2-core machine is noisy), and their ratio to the baseline; issue #30 asks ≤ 2.
The "Ingest next to a tenant's heavy requests" section of docs/reliability.md is rewritten
between its markers. The database is dropped before it returns.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import multiprocessing
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import settle  # noqa: E402
from bench.databases import drop_database, fresh_database  # noqa: E402
from bench.docs_block import write_block  # noqa: E402
from bench.ingest import PEPPER, api_command  # noqa: E402
from bench.loadgen import single_event_body  # noqa: E402
from bench.procs import free_port, serve  # noqa: E402
from metering.config import Settings  # noqa: E402
from metering.db import create_db_engine  # noqa: E402
from metering.keys import Scope  # noqa: E402
from metering.keys_repo import create_key, ensure_tenant  # noqa: E402
from metering.prices import PROVIDER_COSTS, insert_prices, read_catalog_file  # noqa: E402
from metering.settlement.runner import settle_due_now  # noqa: E402

DATABASE = "fairmeter_bench_noisy"
HEAVY = settle.TENANT  # tenant A: the settled period is its
QUIET = "tenant-b"
START = "<!-- bench/noisy_neighbour.py: generated from here -->"
END = "<!-- bench/noisy_neighbour.py: generated up to here -->"
SECTION = "## Ingest next to a tenant's heavy requests"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    parser.add_argument("--connections", type=int, default=4, help="tenant B's clients")
    parser.add_argument("--rate", type=float, default=25.0, help="requests/s per B client")
    parser.add_argument("--phase-s", type=float, default=12.0)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--whatif-runs", type=int, default=5_000)
    parser.add_argument("--heavy-clients", type=int, default=2, help="A's what-if clients")
    parser.add_argument(
        "--api-env", action="append", default=[], help="NAME=VALUE for the API (repeatable)"
    )
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "reliability.md")
    parser.add_argument("--no-docs", action="store_true")
    return parser.parse_args(argv)


def prepare(opts: argparse.Namespace) -> tuple[str, str, str, str]:
    """The database with tenant A's settled period (``bench/settle.py``'s runs, ingested
    through the use case and settled here: replayable as the what-if replays real runs);
    B's ingest key, A's admin and ingest keys."""
    url = fresh_database(DATABASE)
    with psycopg.connect(url) as conn:
        insert_prices(conn, read_catalog_file())
        insert_prices(conn, read_catalog_file(kind=PROVIDER_COSTS), PROVIDER_COSTS)
        ensure_tenant(conn, HEAVY)
    load_args = argparse.Namespace(
        runs=opts.whatif_runs, customers=max(1, opts.whatif_runs // 25), loaders=2, seed=7
    )
    settle.load(url, load_args)
    settings = Settings(database_url=url)
    engine = create_db_engine(settings)
    settle_due_now(engine, settings, now=datetime.now(UTC) + timedelta(days=1))
    engine.dispose()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        _, b_key = create_key(conn, tenant_id=QUIET, scope=Scope.INGEST, pepper=PEPPER)
        _, a_admin = create_key(conn, tenant_id=HEAVY, scope=Scope.ADMIN, pepper=PEPPER)
        _, a_ingest = create_key(conn, tenant_id=HEAVY, scope=Scope.INGEST, pepper=PEPPER)
    return url, b_key, a_admin, a_ingest


# --- tenant B: paced ingest -------------------------------------------------------------


async def paced_ingest(base: str, key: str, opts: argparse.Namespace, tag: str) -> list[float]:
    """Each client sends an event every 1/rate s for phase-s seconds; latencies in ms."""
    latencies: list[float] = []
    headers = {"authorization": f"Bearer {key}", "content-type": "application/cloudevents+json"}
    when = datetime.now(UTC).isoformat().replace("+00:00", "Z")

    async def client(index: int) -> None:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as http:
            start, seq = time.monotonic(), 0
            while (due := start + seq / opts.rate) < start + opts.phase_s:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                body = single_event_body(f"{tag}-{index}", seq, when)
                sent = time.perf_counter()
                reply = await http.post("/v1/events", content=body)
                latencies.append((time.perf_counter() - sent) * 1000)
                assert reply.status_code < 300, reply.text
                seq += 1

    await asyncio.gather(*(client(i) for i in range(opts.connections)))
    return latencies


# --- tenant A: the heaviest it may run --------------------------------------------------


async def heavy_loop(base: str, send: Any, until: float, statuses: dict[int, int]) -> None:
    """``send(http)`` back to back until ``until``; a 429 waits its Retry-After."""
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        while time.monotonic() < until:
            reply = await send(http)
            statuses[reply.status_code] = statuses.get(reply.status_code, 0) + 1
            if reply.status_code == 429:
                await asyncio.sleep(float(reply.headers.get("retry-after", "1")))


def whatif_sender(key: str) -> Any:
    body = {"period": "current", "document": {"rules": {"R4": False}}}

    async def send(http: httpx.AsyncClient) -> httpx.Response:
        return await http.post(
            "/v1/policy/what-if", json=body, headers={"authorization": f"Bearer {key}"}
        )

    return send


def chat_export(run: str, customer: str, spans: int) -> bytes:
    """An OTLP protobuf export of ``spans`` model calls of ``run``, each with usage (each an
    event), in a trace of its own."""
    export = ExportTraceServiceRequest()
    resource_spans = export.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name", value=AnyValue(string_value="a"))
    scope = resource_spans.scope_spans.add()
    trace, end_ns = os.urandom(16), time.time_ns() - 1_000_000_000
    attributes = [
        KeyValue(key="gen_ai.operation.name", value=AnyValue(string_value="chat")),
        KeyValue(key="gen_ai.request.model", value=AnyValue(string_value="agent-small-1")),
        KeyValue(key="gen_ai.usage.input_tokens", value=AnyValue(int_value=100)),
        KeyValue(key="gen_ai.usage.output_tokens", value=AnyValue(int_value=10)),
        KeyValue(key="fairmeter.run.id", value=AnyValue(string_value=run)),
        KeyValue(key="fairmeter.customer.id", value=AnyValue(string_value=customer)),
    ]
    for index in range(spans):
        span = scope.spans.add(
            trace_id=trace,
            span_id=(index + 1).to_bytes(8, "big"),
            name="chat agent-small-1",
            kind=Span.SPAN_KIND_CLIENT,
            start_time_unix_nano=end_ns - 500_000_000,
            end_time_unix_nano=end_ns,
        )
        span.attributes.extend(attributes)
    return export.SerializeToString()


def export_sender(key: str, spans: int, count: int) -> Any:
    """Exports sent in turn from ``count`` made ahead: building a 2,048-span export takes
    the client tens of milliseconds of CPU, which must not be spent during the phase."""
    headers = {"authorization": f"Bearer {key}", "content-type": "application/x-protobuf"}
    bodies = itertools.cycle([chat_export("a-heavy-run", "cust-0000", spans) for _ in range(count)])

    async def send(http: httpx.AsyncClient) -> httpx.Response:
        return await http.post("/v1/traces", content=next(bodies), headers=headers)

    return send


def phase(
    base: str, b_key: str, opts: argparse.Namespace, tag: str, senders: list[Any]
) -> tuple[list[float], dict[int, int]]:
    """B's latencies while A's ``senders`` run back to back in a process of their own: in
    B's event loop, A's client work (a large body sent, a what-if's reply parsed) would
    stall B's clients and be measured as B's latency."""
    fork = multiprocessing.get_context("fork")
    results: multiprocessing.SimpleQueue[dict[int, int]] = fork.SimpleQueue()
    heavy = fork.Process(
        target=_heavy_process, args=(base, senders, opts.phase_s, results), daemon=True
    )
    heavy.start()
    latencies = asyncio.run(paced_ingest(base, b_key, opts, tag))
    statuses = results.get()
    heavy.join()
    results.close()
    return latencies, statuses


def _heavy_process(
    base: str, senders: list[Any], phase_s: float, results: multiprocessing.SimpleQueue[Any]
) -> None:
    statuses: dict[int, int] = {}

    async def run() -> None:
        until = time.monotonic() + phase_s
        await asyncio.gather(*(heavy_loop(base, s, until, statuses) for s in senders))

    asyncio.run(run())
    results.put(statuses)


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def trial(
    base: str, keys: tuple[str, str, str], opts: argparse.Namespace, n: int
) -> dict[str, Any]:
    """One trial's three phases: B's p99 in each, and what A was answered."""
    b_key, a_admin, a_ingest = keys
    spans = api_settings(opts).otlp_max_spans_per_request
    phases = {
        "baseline": [],
        "whatif": [whatif_sender(a_admin)] * opts.heavy_clients,
        # enough exports made ahead that none is sent twice in a phase
        "otlp": [export_sender(a_ingest, spans, math.ceil(opts.phase_s * 4))]
        * (opts.heavy_clients + 1),
    }
    out: dict[str, Any] = {}
    for name, senders in phases.items():
        latencies, statuses = phase(base, b_key, opts, f"{name}{n}", senders)
        out[name] = {"p99_ms": p99(latencies), "requests": len(latencies), "a": statuses}
        print(f"trial {n} {name}: B p99 {out[name]['p99_ms']:.1f} ms, A {statuses}", flush=True)
    return out


def api_settings(opts: argparse.Namespace) -> Settings:
    """The API's settings as ``--api-env`` changes them (for the sizes A sends)."""
    changed = dict(item.split("=", 1) for item in opts.api_env)
    names = {f"FAIRMETER_{name.upper()}": name for name in Settings.model_fields}
    return Settings(**{names[k]: v for k, v in changed.items() if k in names})


def summarise(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Per phase, the median over trials of its p99, and the median over trials of its
    ratio to the same trial's baseline: the phases of a trial run a minute apart, so a
    shared host's load drifting between trials moves both sides of a trial's ratio."""

    def ratio(trial: dict[str, Any], name: str) -> float:
        return float(trial[name]["p99_ms"] / trial["baseline"]["p99_ms"])

    return {
        name: {
            "p99_ms": round(statistics.median(t[name]["p99_ms"] for t in trials), 1),
            "ratio": round(statistics.median(ratio(t, name) for t in trials), 2),
            "per_trial": [f"{t[name]['p99_ms']:.1f} (×{ratio(t, name):.2f})" for t in trials],
            "a": _summed(t[name]["a"] for t in trials),
        }
        for name in trials[0]
    }


def _summed(counts: Any) -> dict[int, int]:
    total: dict[int, int] = {}
    for count in counts:
        for status, n in count.items():
            total[status] = total.get(status, 0) + n
    return dict(sorted(total.items()))


def render(
    summary: dict[str, Any], opts: argparse.Namespace, command: str, load: tuple[float, ...]
) -> str:
    labels = {
        "baseline": "B alone (baseline)",
        "whatif": f"A's what-ifs of {opts.whatif_runs:,} runs from {opts.heavy_clients} clients",
        "otlp": f"A's {api_settings(opts).otlp_max_spans_per_request:,}-span exports to one "
        f"run from {opts.heavy_clients + 1} clients",
    }
    rows = [
        f"| {labels[name]} | {s['p99_ms']} | {s['ratio']} | "
        f"{', '.join(str(v) for v in s['per_trial'])} | "
        f"{', '.join(f'{k}: {v}' for k, v in s['a'].items()) or '-'} |"
        for name, s in summary.items()
    ]
    host = f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    return "\n".join(
        [
            START,
            f"Tenant B: {opts.connections} clients × {opts.rate:g} events/s, single events; "
            f"{opts.trials} trials of {opts.phase_s:g} s phases; medians over the trials of the "
            "p99 and of its ratio to the same trial's baseline.",
            "",
            "| next to | B's ingest p99 (ms) | × baseline | per trial: p99 (× its baseline) "
            "| A's replies |",
            "| --- | ---: | ---: | --- | --- |",
            *rows,
            "",
            f"Command: `{command}`; host: {host}; load average before: "
            f"{', '.join(f'{x:.2f}' for x in load)}.",
            END,
        ]
    )


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)
    load_before = os.getloadavg()
    print(f"preparing {DATABASE} ({opts.whatif_runs:,} settled runs for A) …", flush=True)
    url, b_key, a_admin, a_ingest = prepare(opts)
    env = {
        "DATABASE_URL": url,
        "REDIS_URL": opts.redis_url,
        "FAIRMETER_KEY_PEPPER": PEPPER,
        "FAIRMETER_LOG_LEVEL": "WARNING",
        "FAIRMETER_HEAVY_SLOTS_REDIS_PREFIX": f"fairmeter-bench:slots:{os.getpid()}",
    } | dict(item.split("=", 1) for item in opts.api_env)
    port = free_port()
    try:
        with serve("fairmeter", api_command(port, opts.workers), env, port, opts.workers, ROOT):
            base = f"http://127.0.0.1:{port}"
            keys = (b_key, a_admin, a_ingest)
            warm = argparse.Namespace(**{**vars(opts), "phase_s": 3.0})
            phase(base, b_key, warm, "warm", [whatif_sender(a_admin)])
            trials = [trial(base, keys, opts, n) for n in range(opts.trials)]
    finally:
        drop_database(DATABASE)
    summary = summarise(trials)
    command = "uv run --frozen python bench/noisy_neighbour.py " + " ".join(argv or sys.argv[1:])
    block = render(summary, opts, command.strip(), load_before)
    print(block)
    if not opts.no_docs:
        write_block(opts.docs, START, END, block, new_section=SECTION)


if __name__ == "__main__":
    main()
