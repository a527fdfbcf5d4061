"""Pure: what each rule credited in a period, drawn as horizontal bars in inline SVG.

One row per credit kind (R1–R5, support; "other" only when there is some), bars scaled to
the largest. Each row is a ``<g data-rule=…>`` with a ``<title>`` tooltip giving the exact
micro-USD credited and their provider cost, and its amount written as a person reads it
(never rounded to zero).
"""

from __future__ import annotations

from markupsafe import Markup, escape

from api.amounts import usd_text
from metering.protection.report import RULE_NAMES, UNATTRIBUTED, Figures
from metering.protection.report import SUPPORT as SUPPORT_KIND

WIDTH = 470
ROW_H = 30
LABEL_W = 160  # rule names, right-aligned against the bars
BAR_X = LABEL_W + 10
BAR_MAX = 200  # the amount is written after the bar, inside WIDTH


def _label(kind: str) -> str:
    return (
        f"{kind} {RULE_NAMES[kind]}"
        if kind not in (SUPPORT_KIND, UNATTRIBUTED)
        else (RULE_NAMES[kind])
    )


def credited_by_rule_svg(figures: Figures) -> Markup:
    """The chart; an empty-state note when nothing was credited."""
    rows = [(k, v) for k, v in figures.credited_by_rule if k != UNATTRIBUTED or v]
    if figures.credited_micros == 0:
        return Markup('<p class="empty" id="chart-empty">Nothing was credited in this period.</p>')
    largest = max(v for _, v in rows)
    height = ROW_H * len(rows) + 8
    parts = [
        f'<svg class="rule-chart" id="credited-chart" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-labelledby="credited-chart-title">'
        '<title id="credited-chart-title">Credited by rule</title>'
    ]
    costs = figures.cost_by_rule()
    for i, (kind, micros) in enumerate(rows):
        y = 4 + i * ROW_H
        width = 0.0 if micros == 0 else max(2.0, micros / largest * BAR_MAX)
        amount = f"{usd_text(micros)} USD"
        cost = f"provider cost {usd_text(costs[kind])} USD ({costs[kind]:,} micro-USD)"
        parts.append(
            f'<g class="rule-row" data-rule="{escape(kind)}" data-micros="{micros}">'
            f"<title>{escape(_label(kind))}: {escape(amount)} ({micros:,} micro-USD) credited, "
            f"{escape(cost)}</title>"
            f'<text class="rule-label" x="{LABEL_W}" y="{y + 18}" text-anchor="end">'
            f"{escape(_label(kind))}</text>"
            f'<rect class="bar {escape(kind.lower())}" x="{BAR_X}" y="{y + 5}" '
            f'width="{width:.1f}" height="{ROW_H - 12}" rx="3"/>'
            f'<text class="rule-amount" x="{BAR_X + width + 6:.1f}" y="{y + 18}">'
            f"{escape(amount)}</text></g>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704  (every text part went through escape)
