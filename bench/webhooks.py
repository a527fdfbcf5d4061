"""Outbound webhook benchmark: delivery throughput, and latency from a commit to the receiver.

One run, on a database of its own (``fairmeter_bench_webhooks``, dropped and re-created),
against a receiver of its own (uvicorn in a child process, answering every POST with 204
and noting when each ``webhook-id`` arrived, on the machine's monotonic clock):

1. **throughput** — records ``--messages`` ``run.settled`` notifications (one per run, as
   settlement does), fans them out with ``fan_out_pending`` and delivers them with
   ``deliver_due`` and the worker's ``WebhookSender``, in this process, exactly as the
   Celery tasks call them; then POSTs the same bodies to the same receiver from a bare
   ``httpx.AsyncClient`` loop with as many requests in flight as the worker has delivery
   threads. The ratio of the two rates is the cost of the claim/sign/record path (target
   ≥ 0.5).
2. **latency** — starts a real worker and beat (``celery worker -B``, on a redis-server of
   its own) and commits ``run.settled`` notifications at ``--rate`` a second for
   ``--seconds``, in batches every 10 ms (one notification a batch below 100/s), each
   batch kicking ``fairmeter.fan_out_webhooks`` as ``settle_run_chunk`` does after its
   commit (``kick_once``: sent unless a kick is already waiting); each delivery is timed
   from just before its batch's COMMIT to its arrival at the receiver (p50/p99), and split
   into stages by the database's own times: until the fan-out transaction began, until
   the first attempt started, and the send.

What it stands in for: the timed commit is the notification commit a settlement makes
(``record_many`` of ``run.settled``), not a settlement decision: driving the settlement
worker too would put its cost on the same two processes and hide the webhook path's own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/webhooks.py` puts bench/, not the root, first
    sys.path.insert(0, str(ROOT))

from bench.databases import SERVER, fresh_database  # noqa: E402
from bench.procs import free_port, wait_http  # noqa: E402
from bench.settle import private_redis  # noqa: E402
from metering.config import Settings  # noqa: E402
from metering.db import create_db_engine, raw_transaction  # noqa: E402
from metering.keys import Principal, Scope  # noqa: E402
from metering.keys_repo import ensure_tenant  # noqa: E402
from metering.notifications import Notification, record_many  # noqa: E402
from metering.settlement.runner import now_utc  # noqa: E402
from metering.webhooks.delivery import deliver_due  # noqa: E402
from metering.webhooks.endpoints import EndpointSpec, create_endpoint  # noqa: E402
from metering.webhooks.fanout import fan_out_pending  # noqa: E402
from reconciler.kicks import kick_once  # noqa: E402
from reconciler.webhook_sender import WebhookSender  # noqa: E402

PEPPER = "bench-webhooks-pepper-0123456789abcdef0123456"
DATABASE = "fairmeter_bench_webhooks"
RATIO_TARGET = 0.5
FAN_OUT = "fairmeter.fan_out_webhooks"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=1000.0, help="notifications/s, part 2")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument("--receive", type=int, metavar="PORT", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# --- the receiver (a child process) -------------------------------------------------------


def receive(port: int) -> None:
    """A uvicorn receiver: 204 to every POST, its ``webhook-id`` and arrival noted;
    ``GET /stats`` answers them all, ``DELETE /stats`` forgets them."""
    import uvicorn

    arrivals: dict[str, float] = {}
    posts = [0]

    async def app(scope: dict[str, Any], rcv: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await rcv()).get("more_body"):
            pass
        method = scope["method"]
        body = b""
        if method == "POST":
            posts[0] += 1
            for name, value in scope["headers"]:
                if name == b"webhook-id":
                    arrivals.setdefault(value.decode(), time.monotonic())
            status = 204
        elif method == "DELETE":
            arrivals.clear()
            posts[0] = 0
            status = 204
        else:
            body = json.dumps({"posts": posts[0], "arrivals": arrivals}).encode()
            status = 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


@contextmanager
def receiver() -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--receive", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/stats", deadline_s=120.0)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def stats(base: str) -> dict[str, Any]:
    return dict(httpx.get(f"{base}/stats", timeout=60).json())


def wait_for(base: str, count: int, deadline_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + deadline_s
    while True:
        seen = stats(base)
        if len(seen["arrivals"]) >= count or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


# --- the data ------------------------------------------------------------------------------


def seed(settings: Settings, runs: int, hook_url: str) -> list[tuple[int, str]]:
    """``runs`` runs of customer c1 of tenant bench and one endpoint for run.settled."""
    engine = create_db_engine(settings)
    with raw_transaction(engine) as conn:
        ensure_tenant(conn, "bench")
        conn.execute("INSERT INTO customers (tenant_id, id) VALUES ('bench', 'c1')")
        rows = conn.execute(
            """
            INSERT INTO runs (tenant_id, subject, customer_id, first_event_at, last_event_at,
                              last_received_at, event_count)
            SELECT 'bench', 'run-' || n, 'c1', now(), now(), now(), 0
            FROM generate_series(1, %s) AS n ORDER BY n RETURNING id, subject
            """,
            (runs,),
        ).fetchall()
        create_endpoint(
            conn,
            Principal("bench", Scope.ADMIN, "bench"),
            EndpointSpec(url=f"{hook_url}/hook", event_types=["run.settled"]),
            settings,
        )
    engine.dispose()
    return [(int(r[0]), str(r[1])) for r in rows]


def settled(runs: list[tuple[int, str]], n0: int) -> list[Notification]:
    return [
        Notification("bench", "c1", "run.settled", {"n": n0 + i}, run_id, subject)
        for i, (run_id, subject) in enumerate(runs)
    ]


# --- part 1: throughput --------------------------------------------------------------------


def throughput(settings: Settings, base: str, runs: list[tuple[int, str]]) -> dict[str, float]:
    engine = create_db_engine(settings)
    with raw_transaction(engine) as conn:
        record_many(conn, settled(runs, 0))
    httpx.delete(f"{base}/stats", timeout=60)
    sender = WebhookSender()
    started = time.monotonic()
    fan_out_pending(engine, settings, now_utc, budget_s=600.0)
    fanned = time.monotonic()
    while deliver_due(engine, settings, sender, now_utc):
        pass
    done = time.monotonic()
    sender.close()
    got = len(wait_for(base, len(runs), 60.0)["arrivals"])
    with raw_transaction(engine) as conn:
        bodies = [r[0].encode() for r in conn.execute("SELECT payload FROM webhook_messages")]
    engine.dispose()
    httpx.delete(f"{base}/stats", timeout=60)
    # The bare loop gets what one endpoint gets: its share of the round's send slots.
    in_flight = min(settings.webhooks_endpoint_concurrency, settings.webhooks_delivery_threads)
    bare_s = asyncio.run(bare_loop(f"{base}/hook", bodies, in_flight))
    bare_got = stats(base)["posts"]
    return {
        "messages": len(runs),
        "delivered": got,
        "fanout_s": fanned - started,
        "deliver_s": done - fanned,
        "pipeline_per_s": got / (done - started),
        "deliver_per_s": got / (done - fanned),
        "bare_per_s": bare_got / bare_s,
        "bare_posts": bare_got,
        "concurrency": in_flight,
    }


async def bare_loop(url: str, bodies: list[bytes], concurrency: int) -> float:
    """The same bodies, ``concurrency`` in flight, no claim, no signature, no record."""
    queue = list(reversed(bodies))
    async with httpx.AsyncClient(trust_env=False) as client:

        async def worker() -> None:
            while queue:
                body = queue.pop()
                headers = {"content-type": "application/json", "webhook-id": f"bare-{len(queue)}"}
                await client.post(url, content=body, headers=headers)

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.monotonic() - started


# --- part 2: latency with a real worker ----------------------------------------------------


@contextmanager
def worker(settings: Settings, redis_url: str, log: Path) -> Iterator[None]:
    env = {
        **os.environ,
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": redis_url,
        "FAIRMETER_KEY_PEPPER": PEPPER,
        "FAIRMETER_WEBHOOKS_ALLOW_PRIVATE": "true",
        "FAIRMETER_LOG_LEVEL": "WARNING",
    }
    cmd = [sys.executable, "-m", "celery", "-A", "reconciler.celery_app", "worker", "-B"]
    cmd += ["--concurrency", "2", "--loglevel", "WARNING", "-s", str(log.with_suffix(".beat"))]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def latency(
    settings: Settings, base: str, runs: list[tuple[int, str]], args: argparse.Namespace
) -> dict[str, Any]:
    from celery import Celery

    httpx.delete(f"{base}/stats", timeout=60)
    # Batches every 10 ms; below 100/s one notification a batch, the batches further apart.
    period_s = max(0.01, 1 / args.rate)
    per_batch = max(1, round(args.rate * period_s))
    batches = int(args.seconds / period_s)
    committed: dict[int, float] = {}  # notification id → just before its COMMIT
    # The same instant on the wall clock, to place the database's own times (when the
    # fan-out transaction began, when the first attempt started) on the monotonic one.
    offset_s = time.time() - time.monotonic()
    with private_redis() as redis_url, tempfile.TemporaryDirectory() as tmp:
        client = Celery(broker=redis_url)
        flags = redis.Redis.from_url(redis_url)
        with worker(settings, redis_url, Path(tmp) / "worker.log"):
            # The worker is up once a message sent now arrives.
            with psycopg.connect(settings.database_url) as conn:
                record_many(conn, settled(runs[:1], -1))
            wait_for(base, 1, 180.0)
            httpx.delete(f"{base}/stats", timeout=60)
            with psycopg.connect(settings.database_url) as conn:
                started = time.monotonic()
                for b in range(batches):
                    chunk = runs[1 + b * per_batch : 1 + (b + 1) * per_batch]
                    if not chunk:
                        break
                    ids = record_many(conn, settled(chunk, b * per_batch))
                    at = time.monotonic()
                    conn.commit()
                    committed.update(dict.fromkeys(ids, at))
                    kick_once(flags, FAN_OUT, lambda e: client.send_task(FAN_OUT, expires=e))
                    time.sleep(max(0.0, started + (b + 1) * period_s - time.monotonic()))
                elapsed = time.monotonic() - started
            seen = wait_for(base, len(committed), 180.0)["arrivals"]
        client.close()
        flags.close()
    with psycopg.connect(settings.database_url) as conn:
        rows = conn.execute(
            """
            SELECT m.msg_id, m.notification_id, extract(epoch FROM m.created_at),
                   (SELECT extract(epoch FROM min(a.started_at)) FROM webhook_attempts a
                    WHERE a.message_id = m.id)
            FROM webhook_messages m WHERE m.notification_id = ANY(%s)
            """,
            (list(committed),),
        ).fetchall()
    ms: list[float] = []
    stages: dict[str, list[float]] = {"to fan-out": [], "to first send": [], "send": []}
    for msg_id, notification, made_s, first_s in rows:
        if msg_id not in seen or first_s is None:
            continue
        at, made, first = committed[notification], float(made_s), float(first_s)
        ms.append((seen[msg_id] - at) * 1000)
        stages["to fan-out"].append((made - offset_s - at) * 1000)
        stages["to first send"].append((first - made) * 1000)
        stages["send"].append((seen[msg_id] - (first - offset_s)) * 1000)
    return {
        "committed": len(committed),
        "rate": len(committed) / elapsed,
        "received": len(ms),
        **percentiles(sorted(ms)),
        "stages": {name: percentiles(sorted(v)) for name, v in stages.items()},
    }


def percentiles(ordered: list[float]) -> dict[str, float]:
    if not ordered:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.5), "p99": at(0.99), "max": ordered[-1]}


def report(args: argparse.Namespace, one: dict[str, float], two: dict[str, Any]) -> None:
    print(f"command: {shlex.join([sys.executable, '-m', 'bench.webhooks', *sys.argv[1:]])}")
    print(f"load average: {os.getloadavg()}, cpus: {os.cpu_count()}")
    ratio = one["deliver_per_s"] / one["bare_per_s"]
    print(
        f"throughput: {one['messages']:.0f} messages, {one['delivered']:.0f} received; "
        f"fan-out {one['fanout_s']:.2f} s, delivery {one['deliver_s']:.2f} s; "
        f"{one['concurrency']:.0f} in flight"
    )
    print("| path | messages/s |")
    print("|---|---|")
    print(f"| fan-out + delivery (domain + WebhookSender) | {one['pipeline_per_s']:.0f} |")
    print(f"| delivery alone (deliver_due) | {one['deliver_per_s']:.0f} |")
    print(f"| bare httpx.AsyncClient loop, same bodies | {one['bare_per_s']:.0f} |")
    print(f"| ratio delivery / bare | {ratio:.2f} |")
    print(f"| ratio fan-out + delivery / bare | {one['pipeline_per_s'] / one['bare_per_s']:.2f} |")
    met = "met" if ratio >= RATIO_TARGET else "NOT met"
    print(f"target delivery / bare >= {RATIO_TARGET}: {met}")
    print(
        f"latency: {two['committed']} committed at {two['rate']:.0f}/s (asked {args.rate:g}/s), "
        f"{two['received']} received"
    )
    print("| from COMMIT to receiver | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|")
    print(f"| run.settled webhook | {two['p50']:.0f} | {two['p99']:.0f} | {two['max']:.0f} |")
    print("where the wait is (from the database's clock; each stage's own percentiles):")
    print("| stage | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|")
    what = {
        "to fan-out": "COMMIT → its fan-out transaction began (kick queued, fan-out task waits)",
        "to first send": "fan-out began → first attempt (fan-out, delivery kick, claim)",
        "send": "first attempt → arrival (sign, HTTP)",
    }
    for name, p in two["stages"].items():
        print(f"| {what[name]} | {p['p50']:.0f} | {p['p99']:.0f} | {p['max']:.0f} |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.receive:
        receive(args.receive)
        return 0
    url = fresh_database(DATABASE)
    try:
        settings = Settings(
            database_url=url,
            key_pepper=PEPPER,
            webhooks_allow_private=True,
            webhooks_round_s=600.0,
        )
        latency_runs = int(args.rate * args.seconds) + 1
        with receiver() as base:
            runs = seed(settings, args.messages + latency_runs, base)
            one = throughput(settings, base, runs[: args.messages])
            two = latency(settings, base, runs[args.messages :], args)
        report(args, one, two)
        return 0 if one["delivered"] == args.messages and two["received"] == two["committed"] else 1
    finally:
        if not args.keep_database:
            with psycopg.connect(SERVER, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


if __name__ == "__main__":
    raise SystemExit(main())
