"""Every bench writes its figures the same way: its generated block replaced, prose kept."""

from __future__ import annotations

from pathlib import Path

from bench.docs_block import write_block

START, END = "<!-- x: generated from here -->", "<!-- x: generated up to here -->"


def test_the_block_is_replaced_and_the_prose_around_it_kept(tmp_path: Path):
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\n## X\n\nprose before\n\n{START}\nold\n{END}\n\nprose after\n")
    write_block(page, START, END, f"{START}\nnew\n{END}", new_section="## X")
    assert page.read_text() == (
        f"# Benchmarks\n\n## X\n\nprose before\n\n{START}\nnew\n{END}\n\nprose after\n"
    )


def test_a_page_without_the_block_gets_the_section_at_its_end(tmp_path: Path):
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\n## Other\n\ntext\n\n\n")
    write_block(page, START, END, f"{START}\nnew\n{END}", new_section="## X\n\nwhy\n")
    assert (
        page.read_text()
        == f"# Benchmarks\n\n## Other\n\ntext\n\n## X\n\nwhy\n\n{START}\nnew\n{END}\n"
    )
    missing = tmp_path / "docs" / "new.md"
    write_block(missing, START, END, f"{START}\nnew\n{END}")
    assert missing.read_text() == f"# Benchmarks\n\n{START}\nnew\n{END}\n"


def test_a_section_without_the_block_gets_it_under_its_heading(tmp_path: Path):
    page = tmp_path / "scaling.md"
    page.write_text("# Scaling\n\n## Capacity model\n\nBy hand.\n\n## After\n\nKept.\n")
    write_block(page, START, END, f"{START}\nnew\n{END}", new_section="## Capacity model")
    assert page.read_text() == (
        f"# Scaling\n\n## Capacity model\n\n{START}\nnew\n{END}\n\nBy hand.\n\n## After\n\nKept.\n"
    )
