"""Pure pricing: tokens × catalog price → micro-USD, one line per token class.

A catalog is a list of prices, each in force from ``effective_from`` until the next price of
the same (model, token class). Usage is priced by the price in force at the event's time.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
    """docs/policy.md: round_half_even(tokens × price_per_mtok / 1e6), in integers."""
    if tokens < 0 or micros_per_mtok < 0:
        raise ValueError("tokens and prices are never negative")
    return round_half_even_div(tokens * micros_per_mtok, TOKENS_PER_PRICE_UNIT)


# (from, until, input, cached input, output price): prices in force in [from, until).
_Window = tuple[datetime, datetime, int, int, int]
_DAWN = datetime.min.replace(tzinfo=UTC)
_NEVER = datetime.max.replace(tzinfo=UTC)
_HALF_UNIT = TOKENS_PER_PRICE_UNIT // 2
assert TOKENS_PER_PRICE_UNIT % 2 == 0


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
        per class, without the objects and the exception. A what-if prices every usage line
        of a period (over a million), so the three prices in force are kept per model for
        the window in which none of them changes."""
        windows: dict[str, _Window] = self.__dict__.setdefault("_windows", {})
        window = windows.get(model)
        if window is None or not window[0] <= at < window[1]:
            window = self._window(model, at)
            if window is None:
                return None
            windows[model] = window
        total = 0
        for product in (
            input_tokens * window[2],
            cached_input_tokens * window[3],
            output_tokens * window[4],
        ):
            # line_cost_micros inlined: the same round-half-even division (the unit is
            # even, so "twice the remainder above the unit" is "remainder above half").
            quotient, remainder = divmod(product, TOKENS_PER_PRICE_UNIT)
            if remainder > _HALF_UNIT or (remainder == _HALF_UNIT and quotient % 2 == 1):
                quotient += 1
            total += quotient
        return total

    def _window(self, model: str, at: datetime) -> _Window | None:
        """The span around ``at`` in which the model's three prices stay as they are."""
        start, end, prices = _DAWN, _NEVER, []
        for token_class in (TokenClass.INPUT, TokenClass.CACHED_INPUT, TokenClass.OUTPUT):
            entry = self._schedule.get((model, token_class))
            if entry is None:
                return None
            starts, values = entry
            index = bisect.bisect_right(starts, at) - 1
            if index < 0:
                return None
            start = max(start, starts[index])
            if index + 1 < len(starts):
                end = min(end, starts[index + 1])
            prices.append(values[index])
        return (start, end, prices[0], prices[1], prices[2])

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
