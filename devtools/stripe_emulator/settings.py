"""Behaviour switches of the emulator, changed at run time through ``POST /_emulator/settings``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

DAY_S = 24 * 3600
API_VERSION = "2025-09-30.clover"  # the version the emulator renders in


@dataclass
class EmulatorSettings:
    """Stripe's documented limits, as defaults; tests may loosen or tighten them."""

    allow_negative_values: bool = False
    # One concurrent meter-event call per (customer, meter); a second one gets 429 lock_timeout.
    lock_rule: bool = True
    # Stripe promises identifier uniqueness "within a rolling period of at least 24 hours";
    # the emulator forgets identifiers after exactly that long (None: never forgets).
    identifier_window_s: int | None = DAY_S
    idempotency_window_s: int = DAY_S
    cancel_window_s: int = DAY_S
    past_window_s: int = 35 * DAY_S
    future_window_s: int = 300
    # Injected faults: how long "timeout" stalls and how long "slow" holds a request.
    timeout_s: float = 3.0
    slow_s: float = 1.0
    webhook_url: str | None = None
    webhook_secret: str | None = None
    # Invoicing (see README.md): Stripe's default finalization grace is one hour.
    finalization_grace_s: int = 3600
    auto_pay_after_s: int | None = None
    # A test convenience: Stripe subscribes no one by itself (POST /v1/subscriptions does).
    auto_subscribe: bool = False
    default_currency: str = "usd"
    unit_amount_minor: int = 1
    # "async" (Stripe's v1 meter events): 200 now, an error report later; "sync": refuse a
    # bad meter event with 400 (the v2 endpoint's behaviour, kept for tests that want it).
    validation_mode: str = "async"
    error_report_delay_s: int = 60
    error_report_sample_cap: int = 5
    # Summaries are "eventually consistent" and Stripe documents no bound on the delay: 600 s
    # is the emulator's choice, long enough that a caller reading its own writes notices.
    summary_lag_s: int = 600
    # Requests per wall-clock second, at Stripe's sandbox figures; None: unlimited. Global: 25
    # (live 100); each endpoint (method + path pattern): 25; meter events: their own bucket,
    # not counted against the others, at the 1,000/s Stripe documents for live mode.
    rate_limit_per_s: int | None = 25
    endpoint_rate_limit_per_s: int | None = 25
    meter_event_rate_limit_per_s: int | None = 1000
    auto_deliver: bool = True
    # The account's default API version: what a request without Stripe-Version is served in.
    api_version: str = API_VERSION

    def update(self, changes: dict[str, Any]) -> None:
        """Apply known keys; raise ValueError naming any unknown key or wrong type."""
        known = {f.name: f for f in fields(self)}
        for name, value in changes.items():
            if name not in known:
                raise ValueError(f"unknown setting {name!r}; known: {sorted(known)}")
            current = getattr(self, name)
            if not _type_fits(current, value, name):
                raise ValueError(f"setting {name!r} has the wrong type: {value!r}")
        for name, value in changes.items():
            setattr(self, name, value)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data.get("webhook_secret"):
            data["webhook_secret"] = "***"  # noqa: S105 - a mask, not a secret
        return data


# For measuring the emulator's own capacity, not Stripe's: every rate limit off.
NO_RATE_LIMITS: dict[str, Any] = {
    "rate_limit_per_s": None,
    "endpoint_rate_limit_per_s": None,
    "meter_event_rate_limit_per_s": None,
}

_OPTIONAL = {
    "identifier_window_s",
    "webhook_url",
    "webhook_secret",
    "auto_pay_after_s",
    "rate_limit_per_s",
    "endpoint_rate_limit_per_s",
    "meter_event_rate_limit_per_s",
}
_BOOLS = {"lock_rule", "allow_negative_values", "auto_subscribe", "auto_deliver"}
_CHOICES = {"validation_mode": {"sync", "async"}, "default_currency": {"usd", "eur", "gbp"}}


def _type_fits(current: Any, value: Any, name: str) -> bool:
    if value is None:
        return name in _OPTIONAL
    if isinstance(current, bool) or name in _BOOLS:
        return isinstance(value, bool)
    if name in _CHOICES:
        return value in _CHOICES[name]
    if name in {"timeout_s", "slow_s"}:
        return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    if name in {"webhook_url", "webhook_secret", "api_version"}:
        return isinstance(value, str)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
