"""Printing the memory soak and writing its section of docs/benchmarks.md."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.docs_block import write_block
from bench.rss import CHECKPOINTS, Figures
from bench.settle import machine

START = "<!-- bench/soak.py: generated from here -->"
END = "<!-- bench/soak.py: generated up to here -->"
SECTION = """## Memory soak

`bench/soak.py` (issue #18; `make bench-soak`, not part of `make bench`): the service as
production runs it ingests a million events over HTTP and settles every run, while the RSS
of each of its processes is sampled from `/proc`.

"""


@dataclass(frozen=True)
class Results:
    command: str
    options: dict[str, Any]
    load_before: tuple[float, ...]
    load_after: tuple[float, ...]
    ingested: dict[str, Any]
    settle_lag_s: float
    total_s: float
    settled: dict[str, Any]
    figures: list[Figures]
    errors_logged: int

    @property
    def tolerance(self) -> float:
        return float(self.options["tolerance"])

    @property
    def every_run_settled(self) -> bool:
        s = self.settled
        return bool(s["runs"] == self.ingested["runs"] and s["decided"] == s["runs"])

    @property
    def memory_held(self) -> bool:
        return all(f.within(self.tolerance) for f in self.figures)

    @property
    def passed(self) -> bool:
        return self.every_run_settled and self.memory_held


def mb(kb: int) -> str:
    return f"{kb / 1024:,.1f}"


def process_rows(r: Results) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for f in r.figures:
        notes = []
        if f.started_after_warmup:
            notes.append("started after warm-up")
        if not f.alive_at_end:
            notes.append("gone before the end")
        rows.append(
            (
                f.role,
                str(f.pid),
                mb(f.first_kb),
                mb(f.warm_kb),
                mb(f.peak_kb),
                mb(f.end_kb),
                f"{f.peak_growth_pct:+.1f} %",
                f"{f.end_growth_pct:+.1f} %",
                ("within" if f.within(r.tolerance) else "**beyond**")
                + (f" ({', '.join(notes)})" if notes else ""),
            )
        )
    return rows


HEADINGS = (
    "process",
    "pid",
    "at start MB",
    "after warm-up MB",
    "peak after MB",
    "at the end MB",
    "peak growth",
    "end growth",
    "peak within ±{tol:g} %",
)


def trajectory_rows(r: Results) -> list[tuple[str, ...]]:
    """RSS in MB as the events went in: a leak climbs from column to column."""
    shares = (f"{share * 100:.0f} % in" for share in CHECKPOINTS)
    headings = ("process", "pid", *shares, "end", "life's peak (VmHWM)")
    rows: list[tuple[str, ...]] = [headings]
    for f in r.figures:
        sizes = [mb(kb) if kb is not None else "—" for kb in f.trajectory_kb]
        rows.append((f.role, str(f.pid), *sizes, mb(f.end_kb), mb(f.high_water_kb)))
    return rows


def aligned(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]


def markdown_table(rows: list[tuple[str, ...]]) -> list[str]:
    """Columns of numbers right-aligned; the first column and columns of words left."""
    head, *body = rows

    def numeric(c: int) -> bool:
        return c > 0 and any(ch.isdigit() for row in body for ch in row[c])

    align = tuple("---:" if numeric(c) else "---" for c in range(len(head)))
    return ["| " + " | ".join(row) + " |" for row in (head, align, *body)]


def rates(r: Results) -> list[str]:
    i, s = r.ingested, r.settled
    return [
        f"{i['accepted']:,} events accepted ({i['duplicates']} duplicates) in {i['runs']:,} runs, "
        f"{i['requests']:,} requests ({i['retries']} retried), "
        f"{i['accepted'] / i['seconds']:,.0f} events/s over {i['seconds']:.0f} s of ingest",
        f"{s['decided']:,} of {s['runs']:,} runs settled ({s['decisions']:,} decisions), the "
        f"last {r.settle_lag_s:.1f} s after the last batch was accepted "
        f"({r.total_s:.0f} s after the first)",
        f"{r.errors_logged} ERROR lines in the worker and beat logs",
    ]


def table(r: Results) -> str:
    headings = tuple(h.format(tol=r.tolerance) for h in HEADINGS)
    lines = ["", *aligned([headings, *process_rows(r)]), "", *aligned(trajectory_rows(r))]
    lines += ["", *rates(r), f"outcomes: {r.settled['outcomes']}", verdict(r)]
    return "\n".join(lines)


def verdict(r: Results) -> str:
    memory = (
        f"every process stayed within {r.tolerance:g} % of its size after warm-up"
        if r.memory_held
        else f"**some process grew beyond {r.tolerance:g} %** of its size after warm-up"
    )
    runs = "every run settled" if r.every_run_settled else "**not every run settled**"
    return f"Result: {memory}; {runs}."


def markdown(r: Results) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    o = r.options
    headings = tuple(h.format(tol=r.tolerance) for h in HEADINGS)
    out = [
        START,
        f"Measured {when} with `{r.command}`.",
        "",
        f"- Host: {machine()}; {os.cpu_count()} CPUs seen, shared with other jobs; load "
        f"average before / after: {' '.join(f'{x:.2f}' for x in r.load_before)} / "
        f"{' '.join(f'{x:.2f}' for x in r.load_after)}.",
        f"- Service: `fairmeter serve --workers {o['api_workers']}`, `celery worker "
        f"--pool prefork --concurrency {o['concurrency']}` and `celery beat` (the sweeps), "
        "default settings; broker "
        + ("the Redis given" if o["redis_url"] else "a redis-server of the soak's own")
        + ".",
        f"- Load: {o['clients']} client threads POST batches of whole runs, up to "
        f"{o['batch_size']:,} events each, bench/settle.py's shapes over {o['customers']:,} "
        "customers, every run ended hours ago (due as soon as stored).",
        f"- RSS: VmRSS from `/proc/PID/status` every {o['sample_interval']:g} s; "
        f"warm-up is the first {o['warmup'] * 100:.0f} % of the events accepted.",
        "",
        *markdown_table([headings, *process_rows(r)]),
        "",
        "RSS in MB as the events went in (a leak climbs from column to column); the last "
        "column is the highest VmHWM read, the kernel's mark of the process's peak since it "
        "started (start-up included), which can also catch a spike between two samples:",
        "",
        *markdown_table(trajectory_rows(r)),
        "",
        *(f"- {line}." for line in rates(r)),
        f"- Outcomes: `{r.settled['outcomes']}`.",
        "",
        verdict(r),
        END,
    ]
    return "\n".join(out)


def write_docs(path: Path, r: Results) -> None:
    """Replace the generated block of the section, or append the section the first time."""
    write_block(path, START, END, markdown(r), new_section=SECTION)
