"""Where a benchmark writes its figures: the generated block of its section of a docs page.

Each bench's section is hand-written prose around a block between two HTML comments
(``<!-- bench/x.py: generated from here -->`` … ``generated up to here``); a run replaces
the block and keeps the prose. One definition, for every bench.
"""

from __future__ import annotations

from pathlib import Path


def write_block(path: Path, start: str, end: str, block: str, *, new_section: str = "") -> None:
    """Replace the text from ``start`` through ``end`` by ``block`` (which carries both
    markers), keeping everything around it. A page without the markers but with the
    section's heading (``new_section``'s first line) gets the block under that heading;
    a page without either gets ``new_section`` (heading and prose) and the block at its end."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    heading = new_section.strip("\n").split("\n", 1)[0]
    if start in text and end in text:
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        text = head + block + tail
    elif heading and f"{heading}\n" in text:
        head, _, tail = text.partition(f"{heading}\n")
        text = head + heading + "\n\n" + block + "\n" + tail
    else:
        lead = new_section.strip("\n")
        text = text.rstrip("\n") + "\n\n" + (lead + "\n\n" if lead else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
