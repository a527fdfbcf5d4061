"""The capacity bench's figures: per-core rates, the sizing they imply, docs/scaling.md."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.docs_block import write_block
from bench.settle import machine

START = "<!-- bench/capacity.py: generated from here -->"
END = "<!-- bench/capacity.py: generated up to here -->"
SECTION = "## Capacity model"
PEAK_FACTOR = 5
SECONDS_PER_DAY = 86_400
EVENTS_PER_DAY = (20_000_000, 200_000_000, 2_000_000_000)


@dataclass(frozen=True)
class Phase:
    """One measured piece of work: how many units, and the CPU seconds of each tier."""

    units: int
    wall_s: float
    cpu_s: dict[str, float]


@dataclass(frozen=True)
class Results:
    command: str
    options: dict[str, Any]
    load_before: tuple[float, ...]
    load_after: tuple[float, ...]
    events_per_run: float
    ingest: Phase
    settlement: Phase
    idle: Phase
    deliveries: Phase

    def per_core(self, phase: Phase, tier: str) -> float:
        """Units of ``phase`` per CPU-second of ``tier``: one core's capacity for it."""
        return phase.units / max(1e-9, phase.cpu_s[tier])

    def events_per_core(self) -> dict[str, float]:
        """Events/s one core of each tier carries through the whole pipeline: ingest,
        settlement of the runs they make, one webhook delivery per run."""
        per_run = self.events_per_run

        def through(*costs_s: float) -> float:
            return 1 / sum(costs_s)

        return {
            "API": self.per_core(self.ingest, "api"),
            "worker": through(
                1 / (self.per_core(self.settlement, "worker") * per_run),
                1 / (self.per_core(self.deliveries, "worker") * per_run),
            ),
            "PostgreSQL": through(
                1 / self.per_core(self.ingest, "postgres"),
                1 / (self.per_core(self.settlement, "postgres") * per_run),
                1 / (self.per_core(self.deliveries, "postgres") * per_run),
            ),
        }


def command_line(args: list[str]) -> str:
    return shlex.join(["uv", "run", "--frozen", "python", "bench/capacity.py", *args])


def _rows(r: Results) -> list[tuple[str, str, str, str, str, str]]:
    """(tier, work, units, tier CPU s, per core, wall-clock rate)."""
    rows = []
    for tier, name, label in (("api", "API", "API"), ("postgres", "PostgreSQL", "PostgreSQL")):
        rows.append(_row(r, r.ingest, tier, name, "batch ingest over HTTP", "events", label))
    for tier, name in (("worker", "worker"), ("postgres", "PostgreSQL")):
        rows.append(_row(r, r.settlement, tier, name, "settlement", "runs", name))
    for tier, name in (("worker", "worker"), ("postgres", "PostgreSQL")):
        rows.append(_row(r, r.deliveries, tier, name, "webhook deliveries", "deliveries", name))
    return rows


def _row(
    r: Results, phase: Phase, tier: str, name: str, work: str, unit: str, core: str
) -> tuple[str, str, str, str, str, str]:
    return (
        name,
        work,
        f"{phase.units:,} {unit}",
        f"{phase.cpu_s[tier]:.2f}",
        f"**{r.per_core(phase, tier):,.0f} {unit}/s per {core} core**",
        f"{phase.units / phase.wall_s:,.0f} {unit}/s",
    )


def _sizing(r: Results) -> list[tuple[str, ...]]:
    """(events/day, peak events/s, API cores, worker cores, PostgreSQL cores) at 100 %."""
    per_core = r.events_per_core()
    rows = []
    for per_day in EVENTS_PER_DAY:
        peak = per_day / SECONDS_PER_DAY * PEAK_FACTOR
        cores = [f"{peak / per_core[tier]:,.1f}" for tier in ("API", "worker", "PostgreSQL")]
        rows.append((f"{per_day / 1e6:,.0f} M", f"{peak:,.0f}", *cores))
    return rows


def _server_note(r: Results) -> str:
    phases = (r.ingest, r.settlement, r.deliveries)
    background = " / ".join(f"{p.cpu_s['server']:.2f}" for p in phases)
    backends = " / ".join(f"{p.cpu_s['postgres']:.2f}" for p in phases)
    return (
        f"PostgreSQL CPU is that of every backend of the bench's database (client sessions, "
        f"parallel and autovacuum workers). The server's own processes (WAL writer, "
        f"checkpointer, background writer), shared with every other database on this server, "
        f"took {background} CPU s in the three phases against the backends' {backends}: an "
        f"upper bound of what the bench added to them, not in the table."
    )


def _idle_note(r: Results) -> str:
    idle = r.idle
    return (
        f"With beat ticking and nothing to do, the worker used "
        f"{idle.cpu_s['worker'] / idle.wall_s * 1000:.0f} CPU ms/s and PostgreSQL "
        f"{idle.cpu_s['postgres'] / idle.wall_s * 1000:.0f} (sweeps, fan-out and delivery "
        f"ticks, heartbeats; {idle.wall_s:.0f} s measured): a floor each worker deployment "
        f"pays whatever its load, included in the phases above (settlement took "
        f"{r.settlement.wall_s:.1f} s, the deliveries {r.deliveries.wall_s:.1f} s)."
    )


def table(r: Results) -> str:
    lines = [""]
    for tier, work, units, cpu, core, wall in _rows(r):
        lines.append(f"{tier:10} {work:24} {units:>20} {cpu:>8} CPU s  {core:44} ({wall})")
    lines += ["", _idle_note(r), "", f"events per run: {r.events_per_run:.1f}"]
    per_core = r.events_per_core()
    lines += [f"{tier}: {rate:,.0f} events/s per core" for tier, rate in per_core.items()]
    lines += ["", "events/day, peak events/s, API, worker, PostgreSQL cores:"]
    lines += ["  ".join(row) for row in _sizing(r)]
    return "\n".join(lines)


def markdown(r: Results) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    o = r.options
    loads = f"{' '.join(f'{x:.2f}' for x in r.load_before)} / "
    loads += " ".join(f"{x:.2f}" for x in r.load_after)
    per_core = r.events_per_core()
    out = [
        START,
        f"Measured {when} with `{r.command}` (`make bench-capacity`).",
        "",
        f"- Host: {machine()}; load average before / after: {loads}.",
        f"- API: `fairmeter serve --workers {o['api_workers']}`, batches of "
        f"{o['batch_size']:,} events over {o['connections']} keep-alive connections. "
        f"Worker: prefork `--concurrency {o['concurrency']}`, beat every "
        f"{o['sweep_interval']:g} s, on a redis-server of its own. Workload: "
        f"`bench/settle.py`'s mix of run shapes, {r.events_per_run:.1f} events per run.",
        "- Per core = units ÷ the tier's CPU seconds (user + system, from /proc). The "
        "wall-clock rate is what this shared machine gave meanwhile: not a capacity.",
        "",
        "| tier | work | units | tier CPU s | per core | wall-clock (not a target) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    out += [f"| {' | '.join(row)} |" for row in _rows(r)]
    out += [
        "",
        _server_note(r),
        "",
        _idle_note(r),
        "",
        "The whole pipeline per event (ingest; settlement of the runs; one `run.settled` "
        "webhook per run), one core each: "
        + "; ".join(f"{tier} **{rate:,.0f} events/s**" for tier, rate in per_core.items())
        + ".",
        "",
        f"Cores busy at a {PEAK_FACTOR}× peak over the daily average (100 % busy, no headroom):",
        "",
        "| events/day | peak events/s | API cores | worker cores | PostgreSQL cores |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    out += [f"| {' | '.join(row)} |" for row in _sizing(r)]
    out.append(END)
    return "\n".join(out)


def write_docs(path: Path, r: Results) -> None:
    """Replace the generated block; everything outside it (the hand-written model around
    it) is kept."""
    write_block(path, START, END, markdown(r), new_section=SECTION)
