"""Pure pricing and money: integers, half-even rounding, the price in force at the event time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metering.money import describe_usd, format_usd, round_half_even_div
from metering.pricing import (
    Price,
    PriceCatalog,
    TokenClass,
    TokenCounts,
    UnknownModelError,
    line_cost_micros,
)

JAN = datetime(2026, 1, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)


def catalog() -> PriceCatalog:
    return PriceCatalog.from_prices(
        [
            Price("m", TokenClass.INPUT, 3_000_000, JAN),
            Price("m", TokenClass.CACHED_INPUT, 300_000, JAN),
            Price("m", TokenClass.OUTPUT, 15_000_000, JAN),
            Price("m", TokenClass.INPUT, 2_500_000, DEC),
            Price("m", TokenClass.CACHED_INPUT, 250_000, DEC),
            Price("m", TokenClass.OUTPUT, 12_000_000, DEC),
        ]
    )


@pytest.mark.parametrize(
    ("numerator", "denominator", "expected"),
    [(5, 10, 0), (15, 10, 2), (25, 10, 2), (35, 10, 4), (14, 10, 1), (16, 10, 2), (0, 7, 0)],
)
def test_rounding_is_half_to_even(numerator, denominator, expected):
    assert round_half_even_div(numerator, denominator) == expected


@given(st.integers(0, 10**15), st.integers(1, 10**9))
def test_rounding_matches_decimal_half_even(numerator, denominator):
    exact = (Decimal(numerator) / Decimal(denominator)).quantize(
        Decimal(1), rounding=ROUND_HALF_EVEN
    )
    assert round_half_even_div(numerator, denominator) == int(exact)


def test_line_cost_rounds_half_even_at_half_a_micro():
    # 1 token at 500,000 micros/Mtok is exactly 0.5 micros → 0; 3 tokens → 1.5 → 2
    assert line_cost_micros(1, 500_000) == 0
    assert line_cost_micros(3, 500_000) == 2


def test_negative_tokens_are_refused():
    with pytest.raises(ValueError):
        line_cost_micros(-1, 1)


def test_usage_is_priced_by_the_price_in_force_at_its_time():
    tokens = TokenCounts(input_tokens=1_000_000, cached_input_tokens=0, output_tokens=0)
    before = catalog().price_usage("m", tokens, DEC - timedelta(microseconds=1))
    at_change = catalog().price_usage("m", tokens, DEC)
    assert before.total_micros == 3_000_000
    assert at_change.total_micros == 2_500_000


def test_model_without_a_price_at_that_time_is_unknown():
    tokens = TokenCounts(1, 0, 1)
    with pytest.raises(UnknownModelError):
        catalog().price_usage("m", tokens, JAN - timedelta(seconds=1))
    with pytest.raises(UnknownModelError):
        catalog().price_usage("other", tokens, DEC)


@given(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**9))
def test_usage_total_is_the_sum_of_its_class_lines(input_tokens, cached, output):
    priced = catalog().price_usage("m", TokenCounts(input_tokens, cached, output), JAN)
    assert priced.total_micros == (
        line_cost_micros(input_tokens, 3_000_000)
        + line_cost_micros(cached, 300_000)
        + line_cost_micros(output, 15_000_000)
    )
    assert all(isinstance(v, int) for v in (priced.input_micros, priced.output_micros))


SHARED = catalog()


@given(
    st.sampled_from(["m", "other"]),
    st.integers(0, 10**9),
    st.integers(0, 10**9),
    st.integers(0, 10**9),
    st.datetimes(
        min_value=datetime(2025, 6, 1), max_value=datetime(2027, 6, 1), timezones=st.just(UTC)
    ),
)
def test_the_allocation_free_total_is_price_usage_total_or_none_where_it_raises(
    model, input_tokens, cached, output, at
):
    # What-if prices every usage line of a period with ``total_micros``; the protection
    # report with ``price_usage``: one line must cost the same in both. One catalog for
    # every example, so its cache of the prices in force meets times on both sides of a
    # price change, in any order.
    try:
        expected = SHARED.price_usage(model, TokenCounts(input_tokens, cached, output), at)
    except UnknownModelError:
        assert SHARED.total_micros(model, input_tokens, cached, output, at) is None
    else:
        total = SHARED.total_micros(model, input_tokens, cached, output, at)
        assert total == expected.total_micros


@pytest.mark.parametrize(
    ("micros", "text"), [(1_425_000, "1.42"), (1_435_000, "1.44"), (0, "0.00"), (5, "0.00")]
)
def test_dollars_are_shown_with_half_even_rounding(micros, text):
    assert format_usd(micros) == text


@pytest.mark.parametrize(
    ("micros", "text"), [(1_420_000, "1.42"), (10_500, "0.0105"), (1, "0.000001"), (0, "0.00")]
)
def test_explanations_show_sub_cent_amounts_exactly(micros, text):
    assert describe_usd(micros) == text
