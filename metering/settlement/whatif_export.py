"""Pure: a what-if (``replay.WhatIf``) as CSV for a spreadsheet.

Two tables, each its own file, because a spreadsheet opens one rectangle per file and an
analyst sums columns: a second section under the first would break both.

- :func:`whatif_csv`: one row per customer, then a ``(total)`` row (the customer rows of
  every column add up to it). Every amount is integer micro-USD, as a pair: ``current_…``
  (the decisions in force) next to ``candidate_…`` (the candidate policy).
- :func:`changes_csv`: one row per (old outcome → new outcome), with how many runs and up
  to five example run ids (separated by ``;``).
"""

from __future__ import annotations

import csv
import io

from metering.settlement.replay import Position, Side, WhatIf
from metering.statements.render import TOTAL_ROW, csv_text

AMOUNTS = Position.FIGURES
CSV_HEADER = [
    "customer",
    *(f"{side}_{amount}" for amount in AMOUNTS for side in ("current", "candidate")),
]
CHANGES_HEADER = ["old_outcome", "new_outcome", "runs", "example_runs"]


def _row(customer: str, side: Side) -> list[str]:
    pairs = zip(side.current.figures(), side.candidate.figures(), strict=True)
    return [csv_text(customer), *(str(n) for pair in pairs for n in pair)]


def whatif_csv(report: WhatIf) -> str:
    """Customers in id order, then ``(total)``; customer ids are neutralised for
    spreadsheets (a leading ``=`` is never read as a formula)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_HEADER)
    for customer, side in sorted(report.customers.items()):
        writer.writerow(_row(customer, side))
    writer.writerow(_row(TOTAL_ROW, report.total))
    return out.getvalue()


def changes_csv(report: WhatIf) -> str:
    """The runs whose outcome the candidate changes, by (old, new) outcome."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CHANGES_HEADER)
    for (old, new), change in sorted(report.changes.items()):
        examples = csv_text(";".join(change.examples))  # only a cell's start is read as a formula
        writer.writerow([old, new, str(change.runs), examples])
    return out.getvalue()
