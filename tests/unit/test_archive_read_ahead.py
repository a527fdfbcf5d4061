"""The archive's read-ahead (metering/history/archive.py): the next chunk is read on a thread
of its own while this one is written. What it must keep from a plain loop: every batch in
order, the producer's error raised to the writer (so a month half read is never written as
whole), and a writer that stops early closing the producer (its transaction rolled back)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from metering.history.archive import _read_ahead


def test_every_batch_comes_through_in_order():
    assert list(_read_ahead(iter(range(50)), depth=2)) == list(range(50))


class ChunkFailed(Exception):
    pass


def test_an_error_while_reading_is_raised_to_the_writer_after_the_batches_before_it():
    def chunks() -> Iterator[int]:
        yield 1
        yield 2
        raise ChunkFailed("the connection dropped in the third chunk")

    seen: list[int] = []
    with pytest.raises(ChunkFailed, match="third chunk"):
        for batch in _read_ahead(chunks()):
            seen.append(batch)
    assert seen == [1, 2]


def test_a_writer_that_stops_early_closes_the_reader():
    closed = threading.Event()

    def chunks() -> Iterator[int]:
        try:
            yield from range(1_000_000)
        finally:
            closed.set()  # where a chunk's transaction would roll back

    ahead = _read_ahead(chunks(), depth=2)
    assert next(ahead) == 0
    ahead.close()
    assert closed.wait(5)
    assert not any(t.name == "archive-read-ahead" for t in threading.enumerate())
