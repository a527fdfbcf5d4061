"""Amounts as pages show them: one rendering for the console and the statement page."""

from __future__ import annotations

from markupsafe import Markup

from metering.money import describe_usd, display_usd


def usd_text(micros: int | None) -> str:
    """The figure a person reads (never a credited amount rounded to zero); "—" for none."""
    return "—" if micros is None else display_usd(micros)


def usd_html(micros: int | None) -> Markup:
    """The figure, with every micro-dollar in its tooltip and a ``data-micros`` for tests
    and scripts."""
    if micros is None:
        return Markup("—")
    return Markup(
        '<span class="usd" title="exactly {} USD ({} micro-USD)" data-micros="{}">{}</span>'
    ).format(describe_usd(micros), f"{micros:,}", micros, display_usd(micros))
