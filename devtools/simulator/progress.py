"""Progress bars while sending and waiting (rich on a terminal; nothing when switched off)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

Update = Callable[[int], None]  # set the number of finished items


@contextmanager
def bar(description: str, total: int, *, enabled: bool) -> Iterator[Update]:
    """A bar for ``total`` items; the yielded function sets how many are done."""
    if not enabled:
        yield lambda done: None
        return
    columns = (
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda done: progress.update(task, completed=done)
