"""fairmeter report protection: the same report as the API, for a person or a spreadsheet."""

from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner

from cli.main import main
from metering.errors import MeteringError
from tests.helpers.database import TEST_PEPPER
from tests.protection.scenarios import PERIOD, settle_month


@pytest.fixture
def cli_env(settings, monkeypatch) -> None:
    monkeypatch.setenv("FAIRMETER_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("FAIRMETER_KEY_PEPPER", TEST_PEPPER)


def invoke(*args: str):
    return CliRunner().invoke(main, ["report", "protection", "--tenant", "acme", *args])


def test_summary_names_each_rule_that_credited_and_the_top_customers(engine, settings, db, cli_env):
    settle_month(engine, settings)
    result = invoke("--period", PERIOD)
    assert result.exit_code == 0, result.output
    assert f"Cost of protection — tenant acme, {PERIOD}" in result.output
    # One R1 line (875 micros), four R4 lines, two R5 lines: sub-dollar amounts in full.
    r1 = "    R1 duplicate tool calls 0.000875 USD, provider cost 0.000525 USD\n"
    assert r1 in result.output
    assert "    R4 refunded failures    0.0035 USD, provider cost 0.0021 USD\n" in result.output
    assert "    R5 partial deliveries   0.00175 USD, provider cost 0.00105 USD\n" in result.output
    assert "  margin after protection   -0.002975 USD\n" in result.output
    assert "support credits" not in result.output
    assert "Top customers by restored provider cost\n  cust-1" in result.output
    assert "  cust-2                    0.001575 USD of 0.002625 USD" in result.output


def test_csv_and_json_match_the_api_document(engine, settings, db, cli_env):
    settle_month(engine, settings)
    rows = list(csv.DictReader(io.StringIO(invoke("--period", PERIOD, "--csv").output)))
    document = json.loads(invoke("--period", PERIOD, "--json").output)
    assert rows[-1]["customer"] == "(total)"
    assert int(rows[-1]["credited_micros"]) == document["total"]["credited_micros"] == 7 * 875


def test_a_bad_period_is_refused_naming_the_field(cli_env):
    result = invoke("--period", "November")
    assert isinstance(result.exception, MeteringError)
    assert result.exception.errors[0].path == "$.period"
