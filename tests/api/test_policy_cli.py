"""``fairmeter policy show|set|diff``: the operator's way to the same policy use cases."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from metering.settlement.runner import settle_due_now
from tests.helpers import ROOT
from tests.helpers.ingest import ingest
from tests.helpers.processes import service_env
from tests.helpers.scenarios import scenario

AN_HOUR_AGO = datetime.now(UTC) - timedelta(hours=1)


def test_the_cli_sets_shows_and_diffs_policy_versions(engine, settings, db, tmp_path: Path):
    tenant = f"pol-{uuid.uuid4().hex[:12]}"
    # A run settled under version 0 (R4 refunds it), for the what-if at the end.
    ingest(engine, settings, scenario("server-drop", "drop", "cust-1", AN_HOUR_AGO), tenant=tenant)
    settle_due_now(engine, settings, now=datetime.now(UTC))

    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli", "policy", *args],
            cwd=ROOT,
            env=service_env(settings),
            capture_output=True,
            text=True,
            input=stdin,
            timeout=60,
            check=False,
        )

    shown = cli("show", "--tenant", tenant)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["cap_runs"] == 20
    assert shown.stderr.startswith("version 0\tin force")

    file = tmp_path / "policy.json"
    file.write_text(json.dumps({"cap_runs": 5}))
    made = cli(
        "set", "--tenant", tenant, "--file", str(file), "--set", "rules.R4=false", "--note", "pilot"
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("version 1 in force from ")
    current = json.loads(cli("show", "--tenant", tenant).stdout)
    assert (current["cap_runs"], current["rules"]["R4"]) == (5, False)

    refused = cli("set", "--tenant", tenant, "--set", "rules.R7.action=auto_refund")
    assert refused.returncode != 0
    assert "$.document.rules.R7.under_micros: Field required" in refused.stderr
    from_stdin = cli("set", "--tenant", tenant, "--file", "-", stdin='{"cap_floor_micros": 0}')
    assert from_stdin.returncode == 0, from_stdin.stderr

    diff = cli("diff", "--tenant", tenant, "--from", "0")
    assert diff.returncode == 0, diff.stderr
    assert diff.stdout.splitlines() == [
        "cap_floor_micros\t5000000\t0",
        "cap_runs\t20\t5",
        "rules.R4\ttrue\tfalse",
    ]
    assert cli("diff", "--tenant", tenant).stdout == "cap_floor_micros\t5000000\t0\n"
    listed = cli("show", "--tenant", tenant, "--all").stdout.splitlines()
    assert [line.split("\t")[:2] for line in listed] == [
        ["version 0", "not in force"],
        ["version 1", "not in force"],
        ["version 2", "in force"],
    ]
    period = f"{AN_HOUR_AGO + timedelta(minutes=4):%Y-%m}"  # the run's end's month
    whatif = cli(
        "what-if",
        "--tenant",
        tenant,
        "--period",
        period,
        "--set",
        "cap_runs=1",
        "--set",
        "cap_fraction=0.1",  # as issue #17 writes it: 10 % (100000 ppm)
    )
    assert whatif.returncode == 0, whatif.stderr
    # The latest version (R4 off) under the candidate: the refunded run would be billed.
    lines = whatif.stdout.splitlines()
    assert lines[0] == f"1 run(s) of {period}; 1 of 1 checked reproduced"
    total = [int(figure) for figure in lines[-2].split("\t")[1:]]
    gross = total[2]  # all credited in force, all billed under the candidate, none held
    assert lines[-2].startswith("TOTAL\t") and gross > 0
    cost = -total[-2]  # margin now = billed (0) - provider cost
    assert total[:6] == [0, gross, gross, 0, 0, 0]
    # Protection cost: the credited line's provider cost now (60 % of its price in the
    # test catalog), none under the candidate; margin = billed - provider cost.
    assert total[6:] == [cost, 0, -cost, gross - cost] and 0 < cost < gross
    assert lines[-1] == "refunded → confirmed: 1 run(s), e.g. drop"
    missing = cli("diff", "--tenant", tenant, "--to", "9")
    assert missing.returncode != 0 and "policy_version_not_found" in missing.stderr
