"""The policy document: defaults from the settings, validation with field paths, diffs."""

from __future__ import annotations

from typing import Any

import pytest

from metering.config import Settings
from metering.policies.defaults import settings_policy
from metering.policy import PolicyConfig
from metering.policy.document import PolicyDocument, PolicyProblem, diff_policies, parse_policy
from metering.settlement.due import Windows


def problems(raw: Any) -> list[tuple[str, str]]:
    with pytest.raises(PolicyProblem) as caught:
        parse_policy(raw)
    return caught.value.problems


def test_the_default_document_is_the_built_in_policy() -> None:
    assert parse_policy({}).config() == PolicyConfig()


def test_the_settings_policy_carries_every_knob_of_the_settings() -> None:
    settings = Settings(
        database_url="postgresql://unused",
        cap_fraction_ppm=100_000,
        cap_floor_micros=1,
        cap_runs=3,
        settle_grace_s=5,
        resume_window_s=6,
        idle_timeout_s=7,
    )
    document = settings_policy(settings)
    assert (document.cap_fraction_ppm, document.cap_floor_micros, document.cap_runs) == (
        100_000,
        1,
        3,
    )
    assert (document.settle_grace_s, document.resume_window_s, document.idle_timeout_s) == (
        5,
        6,
        7,
    )
    assert Windows.from_policy(document) == Windows.from_settings(settings)


def test_fields_left_out_come_from_the_defaults_given() -> None:
    defaults = PolicyDocument(cap_runs=7, idle_timeout_s=10_000)
    document = parse_policy({"cap_floor_micros": 0, "rules": {"R1": False}}, defaults=defaults)
    assert (document.cap_runs, document.idle_timeout_s, document.cap_floor_micros) == (
        7,
        10_000,
        0,
    )
    assert (document.rules.r1, document.rules.r2) == (False, True)


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        ({"cap_fraction_ppm": 1_000_001}, "cap_fraction_ppm", "less than or equal to 1000000"),
        ({"cap_fraction_ppm": -1}, "cap_fraction_ppm", "greater than or equal to 0"),
        ({"cap_floor_micros": -5}, "cap_floor_micros", "greater than or equal to 0"),
        ({"cap_floor_micros": 1.5}, "cap_floor_micros", "valid integer"),
        ({"cap_runs": "20"}, "cap_runs", "valid integer"),
        ({"settle_grace_s": -1}, "settle_grace_s", "greater than or equal to 0"),
        ({"resume_window_s": 40 * 86_400}, "resume_window_s", "less than or equal to"),
        ({"idle_timeout_s": 0}, "idle_timeout_s", "greater than 0"),
        (
            {"resume_window_s": 7200, "idle_timeout_s": 3600},
            "idle_timeout_s",
            "must be at least resume_window_s (7200)",
        ),
        ({"rules": {"R1": "yes"}}, "rules.R1", "valid boolean"),
        ({"rules": {"R6": False}}, "rules.R6", "Extra inputs are not permitted"),
        ({"rules": {"R7": {"action": "auto_refund"}}}, "rules.R7.under_micros", "Field required"),
        (
            {"rules": {"R7": {"action": "auto_refund", "under_micros": 0}}},
            "rules.R7.under_micros",
            "greater than 0",
        ),
        (
            {"rules": {"R7": {"action": "hold", "under_micros": 5}}},
            "rules.R7.under_micros",
            "Extra inputs are not permitted",
        ),
        ({"rules": {"R7": {"action": "bill"}}}, "rules.R7", "'hold', 'auto_refund'"),
        ({"cap_percent": 10}, "cap_percent", "Extra inputs are not permitted"),
        ([1, 2], "(document)", "a policy is a JSON object"),
    ],
)
def test_refuses_impossible_values_with_the_field_path(raw: Any, path: str, words: str) -> None:
    [(found_path, message)] = problems(raw)
    assert found_path == path
    assert words in message


def test_reports_every_field_at_fault_at_once() -> None:
    found = problems({"cap_runs": -1, "rules": {"R2": 3}})
    assert [path for path, _ in found] == ["cap_runs", "rules.R2"]


def test_the_stored_form_reads_back_as_the_same_document() -> None:
    document = parse_policy(
        {"cap_runs": 3, "rules": {"R7": {"action": "auto_refund", "under_micros": 2_000_000}}}
    )
    assert parse_policy(document.as_json()) == document
    assert document.as_json()["rules"]["R7"] == {"action": "auto_refund", "under_micros": 2_000_000}


def test_a_diff_names_each_changed_field_by_its_path() -> None:
    old = parse_policy({})
    new = parse_policy({"cap_runs": 3, "rules": {"R4": False}})
    assert diff_policies(old, new) == [("cap_runs", 20, 3), ("rules.R4", True, False)]
    assert diff_policies(new, new) == []


@pytest.mark.parametrize(
    ("fraction", "ppm"), [(0.1, 100_000), (0, 0), (1, 1_000_000), (0.333333, 333_333)]
)
def test_a_cap_written_as_a_fraction_is_stored_exactly_in_ppm(fraction: Any, ppm: int) -> None:
    # Issue #17's own example: `fairmeter policy what-if ... --set cap_fraction=0.1`.
    document = parse_policy({"cap_fraction": fraction})
    assert document.cap_fraction_ppm == ppm
    assert "cap_fraction" not in document.as_json()
    both = parse_policy({"cap_fraction": fraction, "cap_fraction_ppm": ppm})
    assert both == document


def test_a_cap_fraction_over_the_defaults_replaces_their_ppm() -> None:
    defaults = parse_policy({"cap_fraction_ppm": 400_000})
    assert parse_policy({"cap_fraction": 0.05}, defaults=defaults).cap_fraction_ppm == 50_000


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"cap_fraction": 1.5}, "from 0 to 1"),
        ({"cap_fraction": -0.1}, "from 0 to 1"),
        ({"cap_fraction": "10%"}, "from 0 to 1"),
        ({"cap_fraction": True}, "from 0 to 1"),
        ({"cap_fraction": float("nan")}, "from 0 to 1"),
        ({"cap_fraction": 0.1234567}, "6 decimal places"),
        ({"cap_fraction": 0.1, "cap_fraction_ppm": 200_000}, "cap_fraction_ppm says 200000"),
    ],
)
def test_a_cap_fraction_that_is_not_exact_is_refused_not_rounded(raw: Any, words: str) -> None:
    [(path, message)] = problems(raw)
    assert path == "cap_fraction"
    assert words in message
