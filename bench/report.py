"""Printing the ingest benchmark and writing its results into docs/benchmarks.md."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psycopg

from bench.docs_block import write_block

BATCH_VS_COPY_TARGET = 0.25
SINGLE_VS_BARE_TARGET = 0.5
P99_TARGET_MS = 50.0
START = "<!-- bench/ingest.py: generated from here -->"
END = "<!-- bench/ingest.py: generated up to here -->"


@dataclass(frozen=True)
class Results:
    command: str
    options: dict[str, Any]
    loadgen: str
    versions: dict[str, str]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    copy: dict[str, Any]
    batch: dict[str, Any]
    single: dict[str, Any]
    bare: dict[str, Any]
    rounds: list[dict[str, Any]]
    stored: dict[str, int]

    @property
    def batch_ratio(self) -> float:
        return float(self.batch["rate"]) / float(self.copy["rate"])

    @property
    def single_ratio(self) -> float:
        return float(self.single["rate"]) / float(self.bare["rate"])

    def checks(self) -> list[tuple[str, str, str, bool]]:
        """(what, measured, target, met) for each target of the issue."""
        return [
            (
                "(b)/(a) batch ingest vs COPY",
                f"{self.batch_ratio:.2f}",
                f"≥ {BATCH_VS_COPY_TARGET}",
                self.batch_ratio >= BATCH_VS_COPY_TARGET,
            ),
            (
                "(c)/(d) single events vs bare INSERT",
                f"{self.single_ratio:.2f}",
                f"≥ {SINGLE_VS_BARE_TARGET}",
                self.single_ratio >= SINGLE_VS_BARE_TARGET,
            ),
            (
                "(c) p99 latency",
                f"{self.single['p99_ms']:.1f} ms",
                f"< {P99_TARGET_MS:.0f} ms",
                self.single["p99_ms"] < P99_TARGET_MS,
            ),
        ]

    def all_met(self) -> bool:
        return all(met for *_, met in self.checks())


def describe(result: dict[str, Any]) -> str:
    errors = f", {result['errors']} errors" if result.get("errors") else ""
    text = (
        f"{result['rate']:>7,.0f} req/s  p50 {result['p50_ms']:5.1f} ms  "
        f"p99 {result['p99_ms']:6.1f} ms  ({result['requests']} requests{errors})"
    )
    if "cpu_ms" in result:
        text += f"; CPU ms/request {cpu_text(result['cpu_ms'])}"
    if result.get("connections_per_worker"):
        text += f"; connections per worker {result['connections_per_worker']}"
    if "new_db_sessions" in result:
        text += f"; new database sessions {result['new_db_sessions']}"
    return text


def cpu_text(cpu: dict[str, float]) -> str:
    return ", ".join(f"{side} {ms:.2f}" for side, ms in cpu.items())


def command_line(args: list[str]) -> str:
    return shlex.join(["uv", "run", "--frozen", "python", "bench/ingest.py", *args])


def versions(database_url: str, loadgen: str) -> dict[str, str]:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    found = {
        "python": platform.python_version(),
        "litestar": version("litestar"),
        "uvicorn": version("uvicorn"),
        "psycopg": version("psycopg"),
        "sqlalchemy": version("sqlalchemy"),
        "postgresql": str(row[0]).split()[0] if row else "?",
    }
    if loadgen == "wrk":
        out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
        found["wrk"] = (out.stdout or out.stderr).split()[1]
    return found


def _machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} × {model}, {platform.system()} {platform.release()}"


def _rows(results: Results) -> list[tuple[str, str, str]]:
    b, s, d = results.batch, results.single, results.bare
    batch_size = results.options["batch_size"]
    conns = results.options["connections"]
    return [
        (
            "(a) COPY into events",
            f"{results.copy['rate']:,} rows/s",
            "best of two COPYs, before and after (b): "
            + ", ".join(f"{c['rows']:,} rows at {c['rate']:,}/s" for c in results.copy["runs"]),
        ),
        (
            f"(b) HTTP batches of {batch_size}",
            f"{b['rate']:,} events/s",
            f"{b['requests']} requests over {results.options['batch_connections']} conns, "
            f"p50 {b['p50_ms']:.0f} ms, p99 {b['p99_ms']:.0f} ms; "
            f"CPU ms per 1,000 events {cpu_text(b['cpu_ms_per_1000'])}",
        ),
        (
            f"(c) single events, {conns} conns",
            f"{s['rate']:,.0f} req/s",
            f"p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms, {s['errors']} errors; "
            f"CPU ms/request {cpu_text(s['cpu_ms'])}",
        ),
        (
            f"(d) bare INSERT, {conns} conns",
            f"{d['rate']:,.0f} req/s",
            f"p50 {d['p50_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms, {d['errors']} errors; "
            f"CPU ms/request {cpu_text(d['cpu_ms'])}",
        ),
    ]


def table(results: Results) -> str:
    lines = [""]
    for name, value, detail in _rows(results):
        lines.append(f"{name:36} {value:>18}   {detail}")
    lines.append("")
    for what, measured, target, met in results.checks():
        lines.append(f"{what:36} {measured:>18}   target {target}: {'met' if met else 'MISSED'}")
    lines.append(f"load generator: {results.loadgen}; stored: {results.stored}")
    return "\n".join(lines)


def markdown(results: Results) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    v = results.versions
    out = [
        START,
        f"Measured {when} with `{results.command}` (run by `make bench`).",
        "",
        f"- Machine: {_machine()}; load average before / after: "
        f"{' '.join(f'{x:.2f}' for x in results.load_before)} / "
        f"{' '.join(f'{x:.2f}' for x in results.load_after)}.",
        "- Versions: " + ", ".join(f"{name} {value}" for name, value in v.items()) + ".",
        f"- Load generator for (c) and (d): **{results.loadgen}**, "
        f"{results.options['connections']} keep-alive connections, "
        f"{results.options['duration']:g} s per run after {results.options['warmup']:g} s "
        f"of warm-up, {results.options['rounds']} alternating rounds, best round kept; "
        f"both apps under uvicorn with {results.options['workers']} workers"
        + (
            f", the API with {', '.join(results.options['api_env'])}"
            if results.options["api_env"]
            else ""
        )
        + ".",
        "",
        "| measurement | result | detail |",
        "| --- | ---: | --- |",
    ]
    out += [f"| {name} | {value} | {detail} |" for name, value, detail in _rows(results)]
    out += ["", "| ratio | measured | target | |", "| --- | ---: | --- | --- |"]
    out += [
        f"| {what} | {measured} | {target} | {'met' if met else '**missed**'} |"
        for what, measured, target, met in results.checks()
    ]
    out += ["", "All rounds of (c) and (d):", ""]
    out += [f"- round {r['round']} {r['side']}: {describe(r)}" for r in results.rounds]
    out += ["", f"Rows stored, by source: `{results.stored}`.", END]
    return "\n".join(out)


HEADER = """# Benchmarks

Numbers from `bench/`, refreshed by the scripts themselves. The machine is a shared 2-core
VM: other jobs run beside the benchmark, so absolute numbers move by ±20 % between runs;
compare ratios taken in the same run, not numbers across runs.

## Ingest

`bench/ingest.py` (run by `make bench`).

"""


def write_docs(path: Path, results: Results) -> None:
    """Replace the generated block of the Ingest section, keeping the prose around it."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HEADER)
    write_block(path, START, END, markdown(results), new_section="## Ingest")
