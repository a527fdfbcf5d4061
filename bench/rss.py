"""Resident memory of a service's processes over a soak, read from /proc, children included.

Each sample is taken with the soak's progress (the share of its events ingested so far),
so a process's size "after warm-up" is its first sample at or past the warm-up share,
however fast or slow the shared machine made the load. A process is known by its pid: a
worker that is replaced (a pool process recycled, a uvicorn worker restarted) shows up as
a new row, not as a jump in an old one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil


def memory_kb(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) of ``pid`` in kB: its resident size now and the kernel's high-water
    mark of it, which also sees a spike between two samples. None once it is gone."""
    found: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                found[line[:5]] = int(line.split()[1])
    except (OSError, ValueError):
        return None
    if len(found) < 2:
        return None  # a kernel thread, or a process exiting
    return found["VmRSS"], found["VmHWM"]


def helper_role(proc: psutil.Process) -> str | None:
    """A child that is not a worker: multiprocessing's resource tracker, which uvicorn's
    spawned workers start beside them."""
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return None
    return "multiprocessing resource tracker" if "resource_tracker" in cmdline else None


@dataclass(frozen=True)
class Root:
    """A process the soak started, and how to call it and its children in the report.

    ``parent_role`` names the root only when it has children (uvicorn's supervisor with
    ``--workers 2``, Celery's main process over its pool); alone, the root is the worker.
    """

    pid: int
    role: str
    parent_role: str | None = None


CHECKPOINTS = (0.10, 0.25, 0.50, 0.75, 1.0)


@dataclass
class Sample:
    at_s: float  # since the sampler started
    progress: float  # share of the soak's events ingested, 0..1
    rss_kb: int


@dataclass
class Series:
    role: str
    pid: int
    samples: list[Sample] = field(default_factory=list)
    high_water_kb: int = 0


@dataclass(frozen=True)
class Figures:
    """One process's RSS, in kB: at its first sample, after warm-up, its peak from then
    on, and at the end; growth in % of the size after warm-up."""

    role: str
    pid: int
    first_kb: int
    warm_kb: int
    peak_kb: int
    end_kb: int
    started_after_warmup: bool
    alive_at_end: bool
    # RSS at the first sample at or past each share of CHECKPOINTS (None: not alive then).
    trajectory_kb: tuple[int | None, ...]
    high_water_kb: int  # the highest VmHWM read: its peak over its whole life, start-up too

    @property
    def peak_growth_pct(self) -> float:
        return (self.peak_kb - self.warm_kb) * 100 / self.warm_kb

    @property
    def end_growth_pct(self) -> float:
        return (self.end_kb - self.warm_kb) * 100 / self.warm_kb

    def within(self, tolerance_pct: float) -> bool:
        """Stayed within ``tolerance_pct`` of its size after warm-up, at every sample."""
        return self.peak_growth_pct <= tolerance_pct


class RssSampler:
    """Samples the RSS of every process under ``roots`` every ``interval_s`` in a thread
    of its own; ``progress`` is set by whoever drives the load."""

    def __init__(self, roots: list[Root], interval_s: float) -> None:
        self.roots, self.interval_s = roots, interval_s
        self.progress = 0.0
        self.series: dict[int, Series] = {}
        self._started = time.monotonic()
        self._last_at_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()  # the end: every process as the soak leaves it

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        at_s, progress = time.monotonic() - self._started, self.progress
        for pid, role in self._processes():
            memory = memory_kb(pid)
            if memory is None:
                continue
            series = self.series.setdefault(pid, Series(role, pid))
            series.samples.append(Sample(at_s, progress, memory[0]))
            # The kernel raises its mark lazily (on unmapping, not on a glibc trim), so a
            # later reading can be lower than an earlier sample: keep the highest seen.
            series.high_water_kb = max(series.high_water_kb, memory[1])
        self._last_at_s = at_s

    def _processes(self) -> list[tuple[int, str]]:
        found = []
        for root in self.roots:
            try:
                children = psutil.Process(root.pid).children(recursive=True)
            except psutil.Error:
                continue
            if children and root.parent_role:
                found.append((root.pid, root.parent_role))
                found += [(child.pid, helper_role(child) or root.role) for child in children]
            else:
                found.append((root.pid, root.role))
        return found

    def figures(self, warm_progress: float) -> list[Figures]:
        """Per process, in the order first seen."""
        out = []
        for series in self.series.values():
            samples = series.samples
            warm_at = next((i for i, s in enumerate(samples) if s.progress >= warm_progress), 0)
            after = samples[warm_at:]
            out.append(
                Figures(
                    role=series.role,
                    pid=series.pid,
                    first_kb=samples[0].rss_kb,
                    warm_kb=after[0].rss_kb,
                    peak_kb=max(s.rss_kb for s in after),
                    end_kb=samples[-1].rss_kb,
                    started_after_warmup=samples[0].progress >= warm_progress,
                    alive_at_end=samples[-1].at_s == self._last_at_s,
                    trajectory_kb=tuple(at_progress(samples, share) for share in CHECKPOINTS),
                    high_water_kb=series.high_water_kb,
                )
            )
        return out


def at_progress(samples: list[Sample], share: float) -> int | None:
    """RSS at the first sample at or past ``share`` of the events, if alive by then and
    not first seen only later (the replacement of a process is not its size)."""
    if samples[0].progress > share:
        return None
    return next((s.rss_kb for s in samples if s.progress >= share), None)
