"""The provider-cost catalog: the price catalog's file shape, parser and lookup, its own table."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import main
from metering.errors import MeteringError
from metering.prices import PRICES, PROVIDER_COSTS, load_catalog, read_catalog_file
from metering.pricing import TokenClass
from tests.helpers.database import TEST_PEPPER

HEADER = "model,token_class,micros_per_mtok,effective_from\n"


def test_the_shipped_sample_costs_less_than_the_shipped_prices_for_every_entry():
    prices = {(p.model, p.token_class, p.effective_from): p for p in read_catalog_file()}
    costs = read_catalog_file(None, PROVIDER_COSTS)
    assert costs, "the sample provider-cost catalog is empty"
    for cost in costs:
        price = prices[(cost.model, cost.token_class, cost.effective_from)]
        assert cost.micros_per_mtok < price.micros_per_mtok


def test_a_bad_cost_file_names_each_bad_line_and_field_and_loads_nothing(tmp_path: Path):
    file = tmp_path / "costs.csv"
    file.write_text(
        HEADER
        + "m,input,100,2026-01-01T00:00:00Z\n"
        + "m,outptu,-5,yesterday\n"
        + ",input,1.5,2026-01-01T00:00:00Z\n"
    )
    with pytest.raises(MeteringError) as raised:
        read_catalog_file(file, PROVIDER_COSTS)
    error = raised.value
    assert error.status == 422
    assert "provider cost catalog" in error.detail
    assert [(e.path, e.code) for e in error.errors] == [
        ("line 3.token_class", "invalid_provider_cost"),
        ("line 3.micros_per_mtok", "invalid_provider_cost"),
        ("line 3.effective_from", "invalid_provider_cost"),
        ("line 4.model", "invalid_provider_cost"),
    ]


def test_a_bad_price_file_still_says_price(tmp_path: Path):
    file = tmp_path / "prices.csv"
    file.write_text(HEADER + "m,input,abc,2026-01-01T00:00:00Z\n")
    with pytest.raises(MeteringError) as raised:
        read_catalog_file(file, PRICES)
    assert [(e.path, e.code) for e in raised.value.errors] == [
        ("line 2.micros_per_mtok", "invalid_price")
    ]


def test_costs_load_fills_its_own_table_once_and_leaves_prices_alone(
    tmp_path: Path, settings, db, monkeypatch
):
    file = tmp_path / "costs.csv"
    file.write_text(
        HEADER
        + "cost-test-model,input,700000,2026-01-01T00:00:00Z\n"
        + "cost-test-model,input,500000,2026-06-01T00:00:00Z\n"
    )
    monkeypatch.setenv("FAIRMETER_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("FAIRMETER_KEY_PEPPER", TEST_PEPPER)
    try:
        first = CliRunner().invoke(main, ["costs", "load", str(file)])
        assert first.exit_code == 0, first.output
        assert "2 provider cost(s) added, 0 already present" in first.output
        again = CliRunner().invoke(main, ["costs", "load", str(file)])
        assert "0 provider cost(s) added, 2 already present" in again.output
        with db.transaction():
            costs = load_catalog(db, PROVIDER_COSTS)
            prices = load_catalog(db, PRICES)
        may = datetime(2026, 5, 31, tzinfo=UTC)
        july = datetime(2026, 7, 1, tzinfo=UTC)
        assert costs.price_at("cost-test-model", TokenClass.INPUT, may) == 700_000
        assert costs.price_at("cost-test-model", TokenClass.INPUT, july) == 500_000
        assert not prices.knows_model("cost-test-model")
    finally:
        db.execute("DELETE FROM provider_costs WHERE model = 'cost-test-model'")


def test_costs_load_of_a_bad_file_exits_with_the_line_and_field(tmp_path: Path):
    file = tmp_path / "costs.csv"
    file.write_text(HEADER + "m,input,100,not-a-time\n")
    result = CliRunner().invoke(main, ["costs", "load", str(file)])
    assert result.exit_code != 0
    assert isinstance(result.exception, MeteringError)
    assert result.exception.errors[0].path == "line 2.effective_from"
