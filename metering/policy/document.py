"""A tenant's protection policy as a document: the knobs and rule switches, validated.

The document is what an operator writes (API, CLI, file) and what ``policy_versions``
stores; ``PolicyConfig`` is what ``decide`` reads of it. Every field has the default the
process settings give, so an empty document ``{}`` is the policy a tenant gets without one.
Impossible values are refused with the field's path (``rules.R7.under_micros``) and a
sentence, never clamped.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from metering.policy.facts import PPM, PolicyConfig

_STRICT = ConfigDict(frozen=True, extra="forbid", strict=True)
DAY_S = 86_400
# A month of settlement windows is already far beyond any agent run; larger values are typos.
MAX_WINDOW_S = 31 * DAY_S
MAX_MICROS = 10**15  # a billion USD


class HoldUnverified(BaseModel):
    """R7 holds every unverified failure or abandonment for support to review."""

    model_config = _STRICT
    action: Literal["hold"] = "hold"


class AutoRefundUnverified(BaseModel):
    """R7 refunds an unverified failure whose gross is below ``under_micros`` without
    review (the R8 cap still applies); larger ones are held."""

    model_config = _STRICT
    action: Literal["auto_refund"]
    under_micros: Annotated[int, Field(gt=0, le=MAX_MICROS)]


class RuleSwitches(BaseModel):
    """Which rules credit. R0 (bill) and R6 (who cancelled) are definitions, not switches."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=True)
    r1: bool = Field(True, alias="R1", description="credit duplicate tool calls")
    r2: bool = Field(True, alias="R2", description="credit replayed context")
    r3: bool = Field(True, alias="R3", description="credit lost work")
    r4: bool = Field(True, alias="R4", description="refund interrupted runs without output")
    r5: bool = Field(True, alias="R5", description="credit undelivered work of interrupted runs")
    r7: Annotated[HoldUnverified | AutoRefundUnverified, Field(discriminator="action")] = Field(
        default_factory=HoldUnverified, alias="R7"
    )
    r8: bool = Field(True, alias="R8", description="hold credits above the protection cap")


class PolicyDocument(BaseModel):
    """One version of a tenant's protection policy (see docs/policies.md)."""

    model_config = _STRICT
    cap_fraction_ppm: Annotated[int, Field(ge=0, le=PPM)] = 250_000
    cap_floor_micros: Annotated[int, Field(ge=0, le=MAX_MICROS)] = 5_000_000
    cap_runs: Annotated[int, Field(ge=0, le=1_000_000)] = 20
    settle_grace_s: Annotated[int, Field(ge=0, le=MAX_WINDOW_S)] = 120
    resume_window_s: Annotated[int, Field(ge=0, le=MAX_WINDOW_S)] = 900
    idle_timeout_s: Annotated[int, Field(gt=0, le=MAX_WINDOW_S)] = 3600
    rules: RuleSwitches = Field(default_factory=RuleSwitches)

    @field_validator("idle_timeout_s")
    @classmethod
    def _outlasts_the_resume_window(cls, value: int, info: ValidationInfo) -> int:
        # A quiet run is abandoned at idle_timeout; a resume window longer than that could
        # never be waited out, so the setting would silently mean nothing.
        resume_window_s = info.data.get("resume_window_s")
        if isinstance(resume_window_s, int) and value < resume_window_s:
            raise ValueError(f"must be at least resume_window_s ({resume_window_s})")
        return value

    def config(self) -> PolicyConfig:
        """What ``decide`` reads of this document."""
        r7 = self.rules.r7
        return PolicyConfig(
            cap_fraction_ppm=self.cap_fraction_ppm,
            cap_floor_micros=self.cap_floor_micros,
            cap_runs=self.cap_runs,
            r1=self.rules.r1,
            r2=self.rules.r2,
            r3=self.rules.r3,
            r4=self.rules.r4,
            r5=self.rules.r5,
            r7_auto_refund_under_micros=(
                r7.under_micros if isinstance(r7, AutoRefundUnverified) else None
            ),
            r8=self.rules.r8,
        )

    def as_json(self) -> dict[str, Any]:
        """The stored and shown form: every field, rules under their R-names."""
        return self.model_dump(mode="json", by_alias=True)


class PolicyProblem(ValueError):
    """A document that cannot be a policy: each problem is (field path, message)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{path}: {message}" for path, message in problems))


def _path(location: tuple[int | str, ...]) -> str:
    # pydantic names the union member tried (``auto_refund``) in the path; a reader wants
    # the document's own path.
    parts = [str(p) for p in location if p not in ("hold", "auto_refund")]
    return ".".join(parts) or "(document)"


def parse_policy(raw: object, *, defaults: PolicyDocument | None = None) -> PolicyDocument:
    """Validate a document (a JSON object); fields it leaves out come from ``defaults``
    (the settings' policy), so a tenant writes only what it changes.

    Raises PolicyProblem with every field path at fault, not only the first.
    """
    if not isinstance(raw, dict):
        raise PolicyProblem([("(document)", "a policy is a JSON object")])
    raw = _fraction_as_ppm(raw)
    base = (defaults or PolicyDocument()).as_json()
    merged = {**base, **raw}
    if isinstance(raw.get("rules"), dict):
        merged["rules"] = {**base["rules"], **raw["rules"]}
    try:
        return PolicyDocument.model_validate(merged)
    except ValidationError as error:
        raise PolicyProblem(
            [(_path(e["loc"]), e["msg"].removeprefix("Value error, ")) for e in error.errors()]
        ) from None


def _fraction_as_ppm(raw: dict[str, Any]) -> dict[str, Any]:
    """``cap_fraction`` (0.1 for 10 %), as a person writes it, is ``cap_fraction_ppm``
    (100000), as the policy stores it: exact, or refused; never rounded."""
    if "cap_fraction" not in raw:
        return raw
    value = raw["cap_fraction"]
    rest = {key: v for key, v in raw.items() if key != "cap_fraction"}

    def refuse(message: str) -> PolicyProblem:
        return PolicyProblem([("cap_fraction", message)])

    if isinstance(value, bool) or not isinstance(value, int | float):
        raise refuse("must be a number from 0 to 1, e.g. 0.1 for 10 %")
    fraction = Decimal(str(value))  # the number as written, not its binary float
    if not fraction.is_finite() or not 0 <= fraction <= 1:
        raise refuse("must be a number from 0 to 1, e.g. 0.1 for 10 %")
    ppm = fraction * PPM
    if ppm != ppm.to_integral_value():
        raise refuse("at most 6 decimal places (the cap is kept in parts per million)")
    if "cap_fraction_ppm" in raw and raw["cap_fraction_ppm"] != int(ppm):
        raise refuse(f"says {int(ppm)} ppm but cap_fraction_ppm says {raw['cap_fraction_ppm']}")
    rest["cap_fraction_ppm"] = int(ppm)
    return rest


def diff_policies(old: PolicyDocument, new: PolicyDocument) -> list[tuple[str, Any, Any]]:
    """(field path, old value, new value) for each field that differs, in document order."""
    return _diff("", old.as_json(), new.as_json())


def _diff(prefix: str, old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict) and old.keys() == new.keys():
        changes: list[tuple[str, Any, Any]] = []
        for key in old:
            changes.extend(_diff(f"{prefix}{key}.", old[key], new[key]))
        return changes
    return [] if old == new else [(prefix.rstrip("."), old, new)]
