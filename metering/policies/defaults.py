"""The policy a tenant has before it writes one: the process settings, as a document."""

from __future__ import annotations

from metering.config import Settings
from metering.policy.document import PolicyDocument


def settings_policy(settings: Settings) -> PolicyDocument:
    """Version 0 of every tenant's policy: the deployment's settings, every rule on.

    Built through validation, so settings no document could hold fail loudly at start-up.
    """
    return PolicyDocument.model_validate(
        {
            "cap_fraction_ppm": settings.cap_fraction_ppm,
            "cap_floor_micros": settings.cap_floor_micros,
            "cap_runs": settings.cap_runs,
            "settle_grace_s": settings.settle_grace_s,
            "resume_window_s": settings.resume_window_s,
            "idle_timeout_s": settings.idle_timeout_s,
        }
    )
