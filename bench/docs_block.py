"""Where a benchmark writes its figures: the generated block of its section of a docs page.

Each bench's section is hand-written prose around a block between two HTML comments
(``<!-- bench/x.py: generated from here -->`` … ``generated up to here``); a run replaces
the block and keeps the prose. One definition, for every bench.
"""

from __future__ import annotations

from pathlib import Path


def write_block(path: Path, start: str, end: str, block: str, *, new_section: str = "") -> None:
    """Replace the text from ``start`` through ``end`` by ``block`` (which carries both
    markers), keeping everything around it. A page without the markers gets
    ``new_section`` (the section's heading and prose, if any) and the block at its end."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        text = head + block + tail
    else:
        lead = new_section.strip("\n")
        text = text.rstrip("\n") + "\n\n" + (lead + "\n\n" if lead else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
