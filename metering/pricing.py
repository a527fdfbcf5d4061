"""Pure pricing: tokens × catalog price → micro-USD, one line per token class.

A catalog is a list of prices, each in force from ``effective_from`` until the next price of
the same (model, token class). Usage is priced by the price in force at the event's time.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from metering.money import TOKENS_PER_PRICE_UNIT, round_half_even_div


class TokenClass(StrEnum):
    INPUT = "input"
    CACHED_INPUT = "cached_input"
    OUTPUT = "output"


@dataclass(frozen=True, slots=True)
class Price:
    model: str
    token_class: TokenClass
    micros_per_mtok: int
    effective_from: datetime


@dataclass(frozen=True, slots=True)
class TokenCounts:
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int

    def by_class(self) -> dict[TokenClass, int]:
        return {
            TokenClass.INPUT: self.input_tokens,
            TokenClass.CACHED_INPUT: self.cached_input_tokens,
            TokenClass.OUTPUT: self.output_tokens,
        }


@dataclass(frozen=True, slots=True)
class PricedUsage:
    """The cost of one usage event, split by token class; ``total_micros`` is their sum."""

    input_micros: int
    cached_input_micros: int
    output_micros: int

    @property
    def total_micros(self) -> int:
        return self.input_micros + self.cached_input_micros + self.output_micros


def line_cost_micros(tokens: int, micros_per_mtok: int) -> int:
    """DESIGN §4: round_half_even(tokens × price_per_mtok / 1e6), in integers."""
    if tokens < 0 or micros_per_mtok < 0:
        raise ValueError("tokens and prices are never negative")
    return round_half_even_div(tokens * micros_per_mtok, TOKENS_PER_PRICE_UNIT)


class UnknownModelError(LookupError):
    """No price for this model (or token class) is in force at the given time."""

    def __init__(self, model: str, at: datetime) -> None:
        super().__init__(f"no price for model {model!r} in force at {at.isoformat()}")
        self.model = model
        self.at = at


@dataclass(frozen=True)
class PriceCatalog:
    """An immutable, time-indexed view of the price table."""

    _schedule: dict[tuple[str, TokenClass], tuple[list[datetime], list[int]]] = field(
        default_factory=dict
    )

    @classmethod
    def from_prices(cls, prices: Iterable[Price]) -> PriceCatalog:
        grouped: dict[tuple[str, TokenClass], list[Price]] = {}
        for price in prices:
            grouped.setdefault((price.model, price.token_class), []).append(price)
        schedule = {}
        for key, entries in grouped.items():
            entries.sort(key=lambda p: p.effective_from)
            schedule[key] = (
                [p.effective_from for p in entries],
                [p.micros_per_mtok for p in entries],
            )
        return cls(schedule)

    def knows_model(self, model: str) -> bool:
        return any(key[0] == model for key in self._schedule)

    def price_at(self, model: str, token_class: TokenClass, at: datetime) -> int:
        entry = self._schedule.get((model, token_class))
        if entry is None:
            raise UnknownModelError(model, at)
        starts, values = entry
        index = bisect.bisect_right(starts, at) - 1
        if index < 0:
            raise UnknownModelError(model, at)
        return values[index]

    def total_micros(
        self,
        model: str,
        input_tokens: int,
        cached_input_tokens: int,
        output_tokens: int,
        at: datetime,
    ) -> int | None:
        """``price_usage(...).total_micros``, or None where that raises: the same rounding
        per class, without the objects and the exception (a what-if prices every usage line
        of a period, and a model the catalog lacks may be on most of them)."""
        total = 0
        for token_class, count in (
            (TokenClass.INPUT, input_tokens),
            (TokenClass.CACHED_INPUT, cached_input_tokens),
            (TokenClass.OUTPUT, output_tokens),
        ):
            entry = self._schedule.get((model, token_class))
            if entry is None:
                return None
            index = bisect.bisect_right(entry[0], at) - 1
            if index < 0:
                return None
            # line_cost_micros inlined (a few million calls per what-if): the same
            # round-half-even division, tokens and prices never negative here.
            quotient, remainder = divmod(count * entry[1][index], TOKENS_PER_PRICE_UNIT)
            twice = 2 * remainder
            if twice > TOKENS_PER_PRICE_UNIT or (
                twice == TOKENS_PER_PRICE_UNIT and quotient % 2 == 1
            ):
                quotient += 1
            total += quotient
        return total

    def price_usage(self, model: str, tokens: TokenCounts, at: datetime) -> PricedUsage:
        """Price one usage event; raises :class:`UnknownModelError` when nothing is in force."""
        costs = {
            token_class: line_cost_micros(count, self.price_at(model, token_class, at))
            for token_class, count in tokens.by_class().items()
        }
        return PricedUsage(
            input_micros=costs[TokenClass.INPUT],
            cached_input_micros=costs[TokenClass.CACHED_INPUT],
            output_micros=costs[TokenClass.OUTPUT],
        )
