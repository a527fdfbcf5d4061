"""The price catalog every test database is built with.

Not the shipped sample (``metering/data/sample_prices.csv``): that one carries a dated price
change, so tests that place events relative to *now* would price them differently from one
day to the next. These prices never change; tests of time-dependent pricing plant their own
price changes.
"""

from __future__ import annotations

from pathlib import Path

from metering.pricing import Price

TEST_CATALOG = Path(__file__).with_name("prices.csv")
TEST_COSTS = Path(__file__).with_name("provider_costs.csv")  # 60 % of each price


def stable_prices() -> list[Price]:
    from metering.prices import read_catalog_file

    return read_catalog_file(TEST_CATALOG)


def stable_costs() -> list[Price]:
    from metering.prices import PROVIDER_COSTS, read_catalog_file

    return read_catalog_file(TEST_COSTS, PROVIDER_COSTS)
