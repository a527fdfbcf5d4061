"""The console's "What if…" form: a policy document's decision knobs and rule switches as
form fields, and back.

Only what ``decide`` reads is on the form (the cap's knobs and the rule switches): the
settlement windows say when a run is due, not its outcome, so the replay cannot price them;
the candidate keeps the latest version's windows. Values stay in the document's units
(micro-USD, parts per million) so what is typed is exactly what the API would be sent, and
the document's own validation (``metering.policies.versions.parse_over``) judges them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from metering.errors import FieldError, MeteringError, validation_error
from metering.policy.document import PolicyDocument

KNOBS = ("cap_fraction_ppm", "cap_floor_micros", "cap_runs")
SWITCHES = ("R1", "R2", "R3", "R4", "R5", "R8")
R7_ACTIONS = ("hold", "auto_refund")
UNDER = "r7_under_micros"
# Document paths (after ``$.document.``) whose form field has another name.
_FIELD_OF_PATH = {
    "rules.R7.under_micros": UNDER,
    "rules.R7": "r7_action",
    "rules.R7.action": "r7_action",
}
_WHOLE = re.compile(r"-?[0-9]{1,19}")


def form_of(document: PolicyDocument, period: str) -> dict[str, str]:
    """The form's fields filled from ``document`` (a checked switch is ``"on"``)."""
    data = document.as_json()
    rules = data["rules"]
    form = {"period": period, **{knob: str(data[knob]) for knob in KNOBS}}
    form.update({f"rule_{rule}": "on" for rule in SWITCHES if rules[rule]})
    form["r7_action"] = rules["R7"]["action"]
    form[UNDER] = str(rules["R7"].get("under_micros", ""))
    return form


def _whole(form: Mapping[str, str], field: str, path: str, bad: list[FieldError]) -> int | None:
    text = form.get(field, "").strip().replace("_", "")
    if _WHOLE.fullmatch(text):
        return int(text)
    bad.append(FieldError(path, "invalid_form", "enter a whole number, e.g. 250000"))
    return None


def candidate_of(form: Mapping[str, str]) -> dict[str, Any]:
    """The candidate document the form describes (an unchecked switch is off); 422 naming
    each field that is not a whole number. Ranges are the policy's to check."""
    bad: list[FieldError] = []
    document: dict[str, Any] = {
        knob: _whole(form, knob, f"$.document.{knob}", bad) for knob in KNOBS
    }
    rules: dict[str, Any] = {rule: form.get(f"rule_{rule}") == "on" for rule in SWITCHES}
    action = form.get("r7_action", "hold")
    if action == "auto_refund":
        under = _whole(form, UNDER, "$.document.rules.R7.under_micros", bad)
        rules["R7"] = {"action": action, "under_micros": under}
    else:
        rules["R7"] = {"action": action}  # anything but hold is refused by the policy
    if bad:
        raise validation_error(bad, detail="; ".join(e.message for e in bad))
    return {**document, "rules": rules}


def field_errors(error: MeteringError) -> dict[str, str]:
    """Form field → message, from the error's JSON paths (``$.document.rules.R7.…``)."""
    fields: dict[str, str] = {}
    for item in error.errors:
        path = item.path.removeprefix("$.").removeprefix("document.")
        name = _FIELD_OF_PATH.get(path, path).removeprefix("rules.")
        fields.setdefault(name, item.message)
    return fields
