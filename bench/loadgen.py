"""A small HTTP/1.1 keep-alive load generator (asyncio streams, uvloop when available).

httpx costs about a millisecond of client CPU per request, which on a 2-core machine is
CPU taken from the server under test; hand-written HTTP/1.1 over asyncio streams costs a
tenth of that. The same generator drives the Fairmeter endpoint and the bare baseline, so
whatever it costs is paid equally by both sides of a ratio.

Run as a module (``python -m bench.loadgen single ...``) it prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import zip_longest

RUNS_PER_STREAM = 50  # runs each connection spreads its events over (no lock convoys)
CUSTOMERS = 16
# Replies a client sends its request again for, after their Retry-After (``retries``).
RETRIED = frozenset({429, 503})


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    path: str
    headers: dict[str, str]


@dataclass(slots=True)
class LoadResult:
    requests: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    per_worker: list[int] = field(default_factory=list)  # connections, when spread
    cpu_s: float = 0.0  # this client's, while the clock ran

    @property
    def rate(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]

    def summary(self) -> dict[str, float | int | dict[str, int]]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "elapsed_s": round(self.elapsed_s, 3),
            "rate": round(self.rate, 1),
            "p50_ms": round(self.percentile(50), 2),
            "p99_ms": round(self.percentile(99), 2),
            "statuses": self.statuses,
            "connections_per_worker": sorted(self.per_worker, reverse=True),
            "client_cpu_s": round(self.cpu_s, 3),
        }


def single_event_body(stream: str, seq: int, when: str) -> bytes:
    """One run.usage CloudEvent with a unique id; runs spread so requests rarely share one."""
    run = seq % RUNS_PER_STREAM
    return (
        f'{{"specversion":"1.0","id":"{stream}-{seq}","source":"bench/single",'
        f'"type":"run.usage","subject":"run-{stream}-{run}","time":"{when}",'
        f'"data":{{"customer":"cust-{run % CUSTOMERS}","step":{seq + 1},'
        '"model":"agent-large-1","input_tokens":1200,"output_tokens":350}}'
    ).encode()


def _request_bytes(target: Target, body: bytes) -> bytes:
    lines = [f"POST {target.path} HTTP/1.1", f"Host: {target.host}:{target.port}"]
    lines += [f"{name}: {value}" for name, value in target.headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes) -> int:
    return (await _exchange_full(reader, writer, req))[0]


async def _exchange_full(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes
) -> tuple[int, float | None]:
    """The reply's status and its ``Retry-After`` in seconds (``None`` without one)."""
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length, retry_after = 0, None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
        elif name.strip().lower() == b"retry-after":
            retry_after = float(value)
    if length:
        await reader.readexactly(length)
    return status, retry_after


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def worker_of(sockname: tuple[str, int], workers: Sequence[int]) -> int | None:
    """Which server process holds the other end of our connection (psutil, as root)."""
    import psutil

    for pid in workers:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(c.raddr and tuple(c.raddr) == tuple(sockname[:2]) for c in conns):
            return pid
    return None


async def _ping(target: Target, stream: Stream) -> bool:
    probe = b"GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n" % target.host.encode()
    try:
        await _exchange(*stream, probe)
    except (OSError, asyncio.IncompleteReadError):
        return False
    return True


async def _open(target: Target, counts: dict[int, int], quota: int) -> Stream:
    """A keep-alive connection, on a worker holding fewer than ``quota`` when ``counts``
    names the workers: asyncio accepts a burst of connects all in one worker, and which
    worker wins each accept is up to the scheduler, so one worker may get nearly all."""
    for _ in range(200):
        stream = await asyncio.open_connection(target.host, target.port, limit=1 << 20)
        if not counts:
            return stream
        await _ping(target, stream)  # answered: accepted by a worker
        pid = worker_of(stream[1].get_extra_info("sockname"), list(counts))
        if pid is not None and counts[pid] < quota:
            counts[pid] += 1
            return stream
        stream[1].close()
        await asyncio.sleep(0.01)
    raise RuntimeError("could not spread the connections over the workers")


async def _open_all(
    target: Target, n: int, workers: Sequence[int]
) -> tuple[list[Stream], list[int]]:
    """``n`` connections spread over ``workers``, all just used: spreading takes a while,
    and uvicorn closes a connection idle for 5 s."""
    for _ in range(3):
        counts = dict.fromkeys(workers, 0)
        quota = -(-n // max(1, len(workers)))
        streams = [await _open(target, counts, quota) for _ in range(n)]
        alive = await asyncio.gather(*(_ping(target, s) for s in streams))
        if all(alive):
            return streams, list(counts.values())
        for _, writer in streams:
            writer.close()
    raise RuntimeError("connections kept closing while being spread over the workers")


async def _connection(
    target: Target,
    stream: Stream,
    next_body: Callable[[], bytes | None],
    deadline: float,
    result: LoadResult,
    retries: bool = False,
) -> None:
    """Send ``next_body()``'s bodies until they or the time run out; with ``retries`` a 429
    or 503 with ``Retry-After`` is sent again after it, as OTLP exporters do (the statuses
    count every reply; ``errors`` only the final ones that are not 200)."""
    reader, writer = stream
    try:
        while time.perf_counter() < deadline:
            body = next_body()
            if body is None:
                return
            request = _request_bytes(target, body)
            while True:
                started = time.perf_counter()
                status, retry_after = await _exchange_full(reader, writer, request)
                result.latencies_ms.append((time.perf_counter() - started) * 1000)
                result.requests += 1
                result.statuses[str(status)] = result.statuses.get(str(status), 0) + 1
                if retries and status in RETRIED and retry_after is not None:
                    await asyncio.sleep(retry_after)  # as an exporter does: the same body again
                    continue
                if status != 200:
                    result.errors += 1
                break
    finally:
        writer.close()


async def _drive(
    target: Target,
    makers: Sequence[Callable[[], bytes | None]],
    duration_s: float,
    workers: Sequence[int] = (),
    retries: bool = False,
) -> LoadResult:
    """All connections are open (and spread) before the clock starts."""
    streams, per_worker = await _open_all(target, len(makers), workers)
    result = LoadResult(per_worker=per_worker)
    cpu_started = time.process_time()
    started = time.perf_counter()
    deadline = started + duration_s
    await asyncio.gather(
        *(
            _connection(target, s, m, deadline, result, retries)
            for s, m in zip(streams, makers, strict=True)
        )
    )
    result.elapsed_s = time.perf_counter() - started
    result.cpu_s = time.process_time() - cpu_started
    return result


def _run(coro_factory: Callable[[], object]) -> LoadResult:
    try:
        import uvloop

        return uvloop.run(coro_factory())  # type: ignore[arg-type, no-any-return]
    except ImportError:
        return asyncio.run(coro_factory())  # type: ignore[arg-type]


def run_single_events(
    target: Target,
    connections: int,
    duration_s: float,
    prefix: str,
    when: str,
    workers: Sequence[int] = (),
) -> LoadResult:
    """``connections`` keep-alive connections, each sending unique single events."""

    def maker(index: int) -> Callable[[], bytes | None]:
        stream = f"{prefix}{index}"
        counter = iter(range(1 << 62))
        return lambda: single_event_body(stream, next(counter), when)

    makers = [maker(i) for i in range(connections)]
    return _run(lambda: _drive(target, makers, duration_s, workers))


def run_bodies(
    target: Target,
    bodies: Sequence[bytes],
    connections: int,
    workers: Sequence[int] = (),
    retries: bool = False,
) -> LoadResult:
    """Send every body once over ``connections`` connections; stop when all are sent (with
    ``retries``: stored, a 429 or 503 sent again after its ``Retry-After``)."""
    pending = iter(bodies)

    def next_body() -> bytes | None:
        return next(pending, None)

    makers = [next_body] * connections
    return _run(lambda: _drive(target, makers, float("inf"), workers, retries))


def _single_job(args: tuple[Target, int, float, str, str, Sequence[int]]) -> LoadResult:
    return run_single_events(*args)


def run_single_events_multi(
    target: Target,
    connections: int,
    duration_s: float,
    prefix: str,
    when: str,
    procs: int,
    workers: Sequence[int] = (),
) -> LoadResult:
    """The same load split over ``procs`` processes (for when one client core saturates);
    each spreads its own connections evenly over ``workers``."""
    if procs <= 1:
        return run_single_events(target, connections, duration_s, prefix, when, workers)
    shares = [connections // procs + (i < connections % procs) for i in range(procs)]
    jobs = [(target, n, duration_s, f"{prefix}p{i}-", when, workers) for i, n in enumerate(shares)]
    with ProcessPoolExecutor(procs) as pool:
        parts = list(pool.map(_single_job, jobs))
    merged = LoadResult(elapsed_s=max(p.elapsed_s for p in parts))
    for part in parts:
        merged.requests += part.requests
        merged.errors += part.errors
        merged.latencies_ms += part.latencies_ms
        merged.cpu_s += part.cpu_s
        merged.per_worker = [
            a + b for a, b in zip_longest(merged.per_worker, part.per_worker, fillvalue=0)
        ]
        for status, count in part.statuses.items():
            merged.statuses[status] = merged.statuses.get(status, 0) + count
    return merged


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["single"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/v1/events")
    parser.add_argument("--key", default="")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--prefix", default="evt")
    parser.add_argument("--time", required=True, help="RFC 3339 event time")
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument(
        "--workers", default="", help="server worker pids to spread the connections over"
    )
    args = parser.parse_args(argv)
    workers = [int(pid) for pid in args.workers.split(",") if pid]
    headers = {"Content-Type": "application/cloudevents+json"}
    if args.key:
        headers["Authorization"] = f"Bearer {args.key}"
    target = Target(args.host, args.port, args.path, headers)
    result = run_single_events_multi(
        target, args.connections, args.duration, args.prefix, args.time, args.procs, workers
    )
    json.dump(result.summary(), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
