"""``fairmeter policy what-if --csv``: the API's CSV, for a spreadsheet, from the shell."""

from __future__ import annotations

import csv
import io
import uuid

import pytest
from click.testing import CliRunner

from cli.main import main
from metering.settlement.whatif_export import CHANGES_HEADER, CSV_HEADER
from tests.helpers.database import TEST_PEPPER
from tests.protection.scenarios import LINE_GROSS, PERIOD, settle_month


@pytest.fixture
def tenant(engine, settings, db, monkeypatch) -> str:
    monkeypatch.setenv("FAIRMETER_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("FAIRMETER_KEY_PEPPER", TEST_PEPPER)
    name = f"wif-{uuid.uuid4().hex[:12]}"  # policy versions outlive a test
    settle_month(engine, settings, tenant=name)
    return name


def what_if(tenant: str, *args: str):
    command = ["policy", "what-if", "--tenant", tenant, "--period", PERIOD, *args]
    return CliRunner().invoke(main, command)


def test_csv_is_a_row_per_customer_and_a_total_they_add_up_to(tenant):
    result = what_if(tenant, "--set", "rules.R4=false", "--csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert list(rows[0]) == CSV_HEADER
    assert [r["customer"] for r in rows] == ["cust-1", "cust-2", "(total)"]
    for column in CSV_HEADER[1:]:
        assert int(rows[0][column]) + int(rows[1][column]) == int(rows[2][column]), column
    total = rows[-1]
    assert (int(total["current_credited_micros"]), int(total["candidate_credited_micros"])) == (
        7 * LINE_GROSS,
        3 * LINE_GROSS,
    )


def test_csv_of_the_outcome_changes_names_example_runs(tenant):
    result = what_if(tenant, "--set", "rules.R4=false", "--csv", "--table", "changes")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert list(rows[0]) == CHANGES_HEADER
    refunded = [r for r in rows if r["old_outcome"] == "refunded"]
    assert sum(int(r["runs"]) for r in refunded) == 2  # drop-run and dup-run
    assert "drop-run" in ";".join(r["example_runs"] for r in refunded)


def test_an_impossible_knob_is_refused_naming_it_and_writes_no_csv(tenant):
    result = what_if(tenant, "--set", "cap_runs=-1", "--csv")
    assert result.exit_code != 0
    assert "$.document.cap_runs" in result.output
    assert "customer," not in result.output
