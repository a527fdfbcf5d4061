"""Memory soak (issue #18, ``make bench-soak``): a million events ingested and settled by
the real service, and the RSS of each of its processes after warm-up against its peak and
its end.

On a database of its own (``fairmeter_bench_soak``, re-created; dropped at the end unless
``--keep``), with a redis-server of its own as the broker unless ``--redis-url``, it starts
the service as production runs it (docker-compose.yml): ``fairmeter serve --workers 2``,
``celery worker`` (prefork) and ``celery beat``, which drives the sweeps. A few client
threads POST ``--events`` events in batches of whole runs (bench/settle.py's mixed, realistic
shapes, all ended hours ago, so each run is due as soon as it is stored) with an ingest key;
then it waits until every run is settled. Meanwhile it samples VmRSS of every process of
the three, children included. Warm-up is the first ``--warmup`` share of the events (10 %).

It prints and writes the "Memory soak" section of docs/benchmarks.md: per process, RSS
after warm-up, peak after it, at the end, growth in %, and whether the peak stayed within
``--tolerance`` (10 %) of the size after warm-up; also events/s and runs settled.
"""

from __future__ import annotations

import argparse
import http.client
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import psycopg
from celery import Celery

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/soak.py` puts bench/, not the root, first
    sys.path.insert(0, str(ROOT))

from bench import settle as shapes  # noqa: E402
from bench.loadgen import worker_of  # noqa: E402
from bench.procs import Server, free_port, serve  # noqa: E402
from bench.rss import Root, RssSampler  # noqa: E402
from bench.soak_report import Results, table, write_docs  # noqa: E402
from metering.keys import Scope  # noqa: E402
from metering.keys_repo import create_key, ensure_tenant  # noqa: E402
from metering.migrate import upgrade  # noqa: E402
from metering.prices import PROVIDER_COSTS, insert_prices, read_catalog_file  # noqa: E402

DATABASE = "fairmeter_bench_soak"
BATCH_TYPE = "application/cloudevents-batch+json"
RETRIES = 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", shapes.LOCAL_DATABASE_URL),
        help="any database on the server; the soak creates its own beside it",
    )
    parser.add_argument("--database", default=DATABASE, help="name of the soak's database")
    parser.add_argument("--redis-url", help="a Redis nothing else uses; default: its own")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1000, help="events per request, at most")
    parser.add_argument("--clients", type=int, default=4, help="client threads")
    parser.add_argument("--customers", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--api-workers", type=int, default=2, help="as docker-compose.yml")
    parser.add_argument("--concurrency", type=int, default=2, help="Celery pool processes")
    parser.add_argument("--warmup", type=float, default=0.10, help="share of the events")
    parser.add_argument("--tolerance", type=float, default=10.0, help="% growth allowed")
    parser.add_argument("--sample-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--settle-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-docs", action="store_true", help="print only")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    return parser.parse_args(argv)


# --- the database ---------------------------------------------------------------------


def prepare_database(server_url: str, name: str, pepper: str) -> tuple[str, str]:
    """Re-create ``name`` at head with both catalogs, the tenant and an ingest key."""
    drop_database(server_url, name)
    with psycopg.connect(shapes.with_database(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = shapes.with_database(server_url, name)
    upgrade(url)
    with psycopg.connect(url) as conn:
        insert_prices(conn, read_catalog_file())
        insert_prices(conn, read_catalog_file(kind=PROVIDER_COSTS), PROVIDER_COSTS)
        ensure_tenant(conn, shapes.TENANT)
        _, key = create_key(conn, tenant_id=shapes.TENANT, scope=Scope.INGEST, pepper=pepper)
    return url, key


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(shapes.with_database(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the service ------------------------------------------------------------------------


def service_env(url: str, redis_url: str, pepper: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("STRIPE_API_KEY", "FAIRMETER_STRIPE_API_KEY", "FAIRMETER_STRIPE_API_BASE"):
        env.pop(name, None)  # no Stripe: the outbox rows are still written, never pushed
    env.update(
        DATABASE_URL=url,
        REDIS_URL=redis_url,
        FAIRMETER_KEY_PEPPER=pepper,
        FAIRMETER_LOG_LEVEL="WARNING",
        # capacity for one tenant, not that tenant's share (rate_limit_tenant_events)
        FAIRMETER_RATE_LIMIT_TENANT_EVENTS=str(10**9),
    )
    return env


@dataclass
class Service:
    api: Server
    worker_pid: int
    beat_pid: int
    logs: Path

    def roots(self) -> list[Root]:
        return [
            Root(self.api.proc.pid, "API worker", "API supervisor (uvicorn)"),
            Root(self.worker_pid, "Celery pool process", "Celery worker (main)"),
            Root(self.beat_pid, "Celery beat"),
        ]

    def errors_logged(self) -> int:
        return sum(
            "ERROR" in line
            for log in self.logs.glob("*.log")
            for line in log.read_text(errors="replace").splitlines()
        )


def start_service(
    stack: ExitStack, args: argparse.Namespace, env: dict[str, str], logs: Path
) -> Service:
    """The worker and beat started first, as they import while the API starts (each takes
    seconds on a busy machine); returns once every API worker serves, the worker answers
    a ping and beat has opened its schedule."""
    worker_args = ["worker", "--concurrency", str(args.concurrency), "--pool", "prefork"]
    worker_args += ["--loglevel", "WARNING", "--hostname", f"bench-soak-{os.getpid()}@%h"]
    worker = stack.enter_context(shapes.celery(worker_args, env, logs / "worker.log"))
    beat_args = ["beat", "--loglevel", "WARNING", "--schedule", str(logs / "beat-schedule")]
    beat = stack.enter_context(shapes.celery(beat_args, env, logs / "beat.log"))
    port = free_port()
    cmd = [sys.executable, "-m", "cli", "serve", "--port", str(port)]
    cmd += ["--workers", str(args.api_workers)]
    api = stack.enter_context(serve("fairmeter", cmd, env, port, args.api_workers, ROOT))
    client = Celery("bench", broker=env["REDIS_URL"])
    try:
        shapes.wait_for_worker(client, worker, logs / "worker.log")
    finally:
        client.close()
    wait_for_beat(beat, logs)
    return Service(api, worker.pid, beat.pid, logs)


def wait_for_beat(beat: subprocess.Popen[bytes], logs: Path, deadline_s: float = 60.0) -> None:
    """Until beat has opened its schedule, which it does once the app is imported: a
    sample taken while it still imports would make its later size look like growth."""
    deadline = time.monotonic() + deadline_s
    while not any(logs.glob("beat-schedule*")):
        if beat.poll() is not None:
            raise RuntimeError(f"beat exited:\n{(logs / 'beat.log').read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"beat did not open its schedule within {deadline_s:g} s")
        time.sleep(0.1)


# --- the load ---------------------------------------------------------------------------


class Feed:
    """Request bodies of whole runs, up to ``batch_size`` events each, until ``events``
    are handed out; shared by the client threads. A run never straddles two requests: its
    head alone would be due (it ended hours ago), settled, and re-opened by its tail."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.target, self.batch_size = args.events, args.batch_size
        self._runs = shapes.workload(0, 10**7, args.customers, args.seed)
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.handed_out = self.runs = 0

    def next_body(self) -> bytes | None:
        with self._lock:
            batch = self._pending
            while self.handed_out + len(batch) < self.target:
                run = next(self._runs)
                self.runs += 1
                if batch and len(batch) + len(run) > self.batch_size:
                    self._pending = run
                    break
                batch = batch + run
                self._pending = []
            else:
                self._pending = []
            if not batch:
                return None
            self.handed_out += len(batch)
            return msgspec.json.encode(batch)


@dataclass
class Ingested:
    accepted: int = 0
    duplicates: int = 0
    requests: int = 0
    retries: int = 0
    seconds: float = 0.0


class Spread:
    """Keep-alive connections held evenly by the API's workers. The kernel hands a burst
    of connects mostly to one worker, and a soak whose other worker idles would measure
    only one: each connection is checked, by pid, and made again until its worker has
    fewer than its share."""

    def __init__(self, server: Server, clients: int) -> None:
        self.port = server.port
        self.held = dict.fromkeys((p.pid for p in server.workers()), 0)
        self.quota = -(-clients // max(1, len(self.held)))
        self._lock = threading.Lock()

    def connect(self) -> http.client.HTTPConnection:
        for _ in range(200):
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
            conn.request("GET", "/healthz")  # answered: a worker has accepted it
            conn.getresponse().read()
            assert conn.sock is not None
            pid = worker_of(conn.sock.getsockname(), list(self.held))
            with self._lock:
                if pid is not None and self.held[pid] < self.quota:
                    self.held[pid] += 1
                    return conn
            conn.close()
            time.sleep(0.01)
        raise RuntimeError("could not spread the connections over the API workers")


def ingest(feed: Feed, spread: Spread, key: str, clients: int, sampler: RssSampler) -> Ingested:
    """POST every body of ``feed`` from ``clients`` threads, one connection each; the
    sampler learns the share of events accepted so far. A request still refused after
    retries ends the soak."""
    done, lock = Ingested(), threading.Lock()
    failures: list[RuntimeError] = []
    headers = {"Authorization": f"Bearer {key}", "Content-Type": BATCH_TYPE}
    connections = [spread.connect() for _ in range(clients)]

    def client(conn: http.client.HTTPConnection) -> None:
        try:
            while not failures and (body := feed.next_body()) is not None:
                reply, retries = post(conn, headers, body)
                with lock:
                    done.accepted += reply["accepted"]
                    done.duplicates += reply["duplicates"]
                    done.requests += 1
                    done.retries += retries
                    sampler.progress = min(1.0, done.accepted / feed.target)
        except RuntimeError as exc:
            failures.append(exc)
        finally:
            conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in connections]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.seconds = time.perf_counter() - started
    if failures:
        raise failures[0]
    return done


def post(
    conn: http.client.HTTPConnection, headers: dict[str, str], body: bytes
) -> tuple[dict[str, Any], int]:
    """The reply of one batch, retrying what a busy server may answer (429, 503, a
    dropped connection, which ``http.client`` makes again); (reply, retries)."""
    problem = ""
    for attempt in range(RETRIES):
        try:
            conn.request("POST", "/v1/events", body, headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            problem = repr(exc)
        else:
            if response.status == 200:
                return msgspec.json.decode(data), attempt
            problem = f"{response.status} {data[:300]!r}"
            if response.status not in (429, 503):
                break
        time.sleep(0.5 * 2**attempt)
    raise RuntimeError(f"a batch was refused: {problem}")


# --- settlement -------------------------------------------------------------------------


def wait_settled(url: str, timeout_s: float) -> float:
    """Seconds until no stored run is left without a decision."""
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        while not shapes.all_decided(conn):
            if time.perf_counter() - started > timeout_s:
                left = conn.execute("SELECT count(*) FROM runs WHERE decision_version = 0")
                raise TimeoutError(f"{left.fetchone()} runs unsettled after {timeout_s:g} s")
            time.sleep(0.5)
    return time.perf_counter() - started


def settled(url: str) -> dict[str, Any]:
    """Runs stored, runs with a decision, decisions written, outcomes."""
    with psycopg.connect(url) as conn:
        runs, decided = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE decision_version > 0) FROM runs"
        ).fetchone() or (0, 0)
        decisions = conn.execute("SELECT count(*) FROM decisions").fetchone()
        outcomes = conn.execute("SELECT outcome, count(*) FROM runs GROUP BY 1 ORDER BY 2 DESC")
        return {
            "runs": int(runs),
            "decided": int(decided),
            "decisions": int(decisions[0]) if decisions else 0,
            "outcomes": {str(o): int(n) for o, n in outcomes.fetchall()},
        }


# --- the soak ---------------------------------------------------------------------------


def soak(args: argparse.Namespace, url: str, redis_url: str, key: str, pepper: str) -> Results:
    logs = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    load_before = os.getloadavg()
    with ExitStack() as stack:
        service = start_service(stack, args, service_env(url, redis_url, pepper), logs)
        print(f"service up; ingesting {args.events:,} events …", flush=True)
        with RssSampler(service.roots(), args.sample_interval) as sampler:
            feed, spread = Feed(args), Spread(service.api, args.clients)
            started = time.perf_counter()
            done = ingest(feed, spread, key, args.clients, sampler)
            print(f"  {done.accepted:,} events in {done.seconds:.1f} s; settling …", flush=True)
            lag_s = wait_settled(url, args.settle_timeout)
            total_s = time.perf_counter() - started
            time.sleep(3 * args.sample_interval)  # a few samples of the idle service
        errors = service.errors_logged()
    shutil.rmtree(logs, ignore_errors=True)
    return Results(
        command=shlex.join(["uv", "run", "--frozen", "python", "bench/soak.py", *args.argv]),
        options=vars(args),
        load_before=load_before,
        load_after=os.getloadavg(),
        ingested=vars(done) | {"runs": feed.runs},
        settle_lag_s=lag_s,
        total_s=total_s,
        settled=settled(url),
        figures=sampler.figures(args.warmup),
        errors_logged=errors,
    )


def run(argv: list[str]) -> Results:
    """The whole soak, on a database re-created for it and dropped after (unless --keep)."""
    args = parse_args(argv)
    args.argv = argv
    pepper = secrets.token_urlsafe(48)
    url, key = prepare_database(args.database_url, args.database, pepper)
    try:
        with ExitStack() as stack:
            redis_url = args.redis_url or stack.enter_context(shapes.private_redis())
            return soak(args, url, redis_url, key, pepper)
    finally:
        if not args.keep:
            drop_database(args.database_url, args.database)


def main(argv: list[str]) -> int:
    results = run(argv)
    print(table(results))
    if not results.options["no_docs"]:
        write_docs(results.options["docs"], results)
        print(f"wrote {results.options['docs']}")
    return 0 if results.passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
