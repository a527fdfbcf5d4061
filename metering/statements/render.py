"""Statement rendering helpers: CSV rows and the daily chart's SVG (pure)."""

from __future__ import annotations

import calendar
import csv
import io
from collections.abc import Iterable, Iterator
from datetime import date
from html import escape

from metering.money import describe_usd, display_usd, format_usd
from metering.statements.query import StatementLine

CSV_HEADER = [
    "kind",
    "run",
    "version",
    "started_at",
    "ended_at",
    "models",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "gross_micros",
    "billed_micros",
    "credited_micros",
    "gross_usd",
    "billed_usd",
    "credited_usd",
    "outcome",
    "status",
    "explanation",
    "corrects_period",
    "stripe",
]


# OWASP's CSV-injection rule: a spreadsheet reads a cell that starts with one of these as a
# formula (=cmd|' /C calc'!A0), so such a cell gets a leading single quote, which makes
# Excel, LibreOffice and Sheets read it as text. LF is added for the same reason as CR.
FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r", "\n")
# The customer cell of a report's total row. No customer id can start with "(" (ids start
# with a letter or digit), so no customer can be mistaken for the total.
TOTAL_ROW = "(total)"


def csv_text(value: str) -> str:
    """A text cell as a spreadsheet will show it and never evaluate it."""
    return "'" + value if value.startswith(FORMULA_TRIGGERS) else value


def csv_row(line: StatementLine) -> list[str]:
    """One line's cells. Text is neutralised; numbers we format ourselves (a negative
    correction is ``-1200``) stay numbers."""
    return [
        csv_text(line.kind),
        csv_text(line.run),
        str(line.version),
        line.started_at.isoformat(),
        line.ended_at.isoformat(),
        csv_text(";".join(line.models)),
        str(line.input_tokens),
        str(line.cached_input_tokens),
        str(line.output_tokens),
        str(line.gross_micros),
        str(line.billed_micros),
        str(line.credited_micros),
        format_usd(line.gross_micros),
        format_usd(line.billed_micros),
        format_usd(line.credited_micros),
        csv_text(line.outcome),
        csv_text(line.status),
        csv_text(line.explanation),
        csv_text(line.corrects_period or ""),
        csv_text(line.stripe),
    ]


def csv_chunks(lines: Iterable[StatementLine], rows_per_chunk: int = 500) -> Iterator[bytes]:
    """The CSV, header first, in chunks of rows: constant memory for any number of lines.

    Every cell is quoted (OWASP): where the spreadsheet's separator is ``;`` (most of
    Europe), an unquoted ``a;=1+1`` would split into a second cell that is a formula."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, quoting=csv.QUOTE_ALL)
    writer.writerow(CSV_HEADER)
    for count, line in enumerate(lines, start=1):
        writer.writerow(csv_row(line))
        if count % rows_per_chunk == 0:
            yield buffer.getvalue().encode()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue().encode()


AXIS_MARGIN = 64  # room left of the bars for the y-axis labels


def _y_axis(top_micros: int, base: float, scale: float, width: int) -> list[str]:
    """Gridlines and USD labels at 0, half and the top value: a bar's height means an
    amount only when the axis says which."""
    parts = [f'<line x1="{AXIS_MARGIN}" y1="8" x2="{AXIS_MARGIN}" y2="{base}" class="axis"/>']
    for fraction in (0, 0.5, 1):
        value = round(top_micros * fraction)
        y = round(base - value / top_micros * scale, 1)
        parts.append(
            f'<line x1="{AXIS_MARGIN}" y1="{y}" x2="{width}" y2="{y}" class="grid"/>'
            f'<text x="{AXIS_MARGIN - 6}" y="{y + 3}" class="ytick" data-micros="{value}">'
            f"{display_usd(value)}</text>"
        )
    return parts


def daily_chart_svg(period: str, days: list[tuple[date, int, int]], width: int = 760) -> str:
    """One pair of bars per day of the month: billed (dark) and restored (green), on a
    y-axis in USD."""
    year, month = (int(p) for p in period.split("-"))
    count = calendar.monthrange(year, month)[1]
    by_day = {d.day: (billed, restored) for d, billed, restored in days if d.month == month}
    top = max([max(b, r) for b, r in by_day.values()] + [1])
    height, base, slot = 180, 160, (width - AXIS_MARGIN) / count
    scale = base - 10
    bars = _y_axis(top, base, scale, width)
    for day in range(1, count + 1):
        billed, restored = by_day.get(day, (0, 0))
        x = AXIS_MARGIN + (day - 1) * slot
        for offset, value, css in ((0.1, billed, "billed"), (0.5, restored, "restored")):
            bar = round(value / top * scale, 1)
            bars.append(
                f'<rect class="bar {css}" data-day="{day}" x="{x + offset * slot:.1f}" '
                f'y="{base - bar:.1f}" width="{slot * 0.38:.1f}" height="{bar}">'
                f"<title>{escape(f'{period}-{day:02d}')}: {css} {describe_usd(value)} USD</title>"
                "</rect>"
            )
        if day == 1 or day % 5 == 0:
            bars.append(f'<text x="{x + slot / 2:.1f}" y="{height - 4}" class="tick">{day}</text>')
    return (
        f'<svg class="daily-chart" role="img" aria-label="Billed and restored usage per day, '
        f'in USD" viewBox="0 0 {width} {height}" width="100%" data-days="{count}">'
        f'<line x1="{AXIS_MARGIN}" y1="{base}" x2="{width}" y2="{base}" class="axis"/>'
        + "".join(bars)
        + "</svg>"
    )
