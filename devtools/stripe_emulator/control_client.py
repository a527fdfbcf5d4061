"""A small client for the ``/_emulator/`` control API, for tests and scripts (stdlib only)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


class EmulatorControl:
    """Drive a running emulator (in-process or ``fairmeter stripe-emulator``) over HTTP."""

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def state(self) -> dict[str, Any]:
        return self._call("GET", "/state")

    def set_clock(self, now: int, *, frozen: bool = False) -> dict[str, Any]:
        return self._call("POST", "/clock", {"now": now, "frozen": frozen})

    def advance_clock(self, seconds: float) -> dict[str, Any]:
        return self._call("POST", "/clock", {"advance_s": seconds})

    def inject_faults(self, **plan: Any) -> dict[str, Any]:
        """E.g. ``inject_faults(next=["500"], path="/v1/billing/meter_events")``."""
        return self._call("POST", "/faults", plan)

    def clear_faults(self) -> dict[str, Any]:
        return self._call("DELETE", "/faults")

    def settings(self, **changes: Any) -> dict[str, Any]:
        return self._call("POST", "/settings", changes)

    def reset(self) -> dict[str, Any]:
        return self._call("POST", "/reset")

    def deliver_webhook(self, **request: Any) -> dict[str, Any]:
        """Deliver a signed event; see ``devtools.stripe_emulator.control`` for the fields."""
        return self._call("POST", "/webhooks", request)

    def subscribe(self, customer: str, **options: Any) -> dict[str, Any]:
        """Bill ``customer``: ``currency``, ``unit_amount`` (minor units), ``meters``, ``start``."""
        return self._call("POST", "/subscriptions", {"customer": customer, **options})

    def run_invoicing(self) -> dict[str, Any]:
        """Create, finalize and pay what is due now; issue due error reports; deliver."""
        return self._call("POST", "/invoicing/run")

    def pay_invoice(self, invoice_id: str) -> dict[str, Any]:
        return self._call("POST", f"/invoices/{invoice_id}/pay")

    def add_destination(
        self, *, url: str, secret: str, style: str, **options: Any
    ) -> dict[str, Any]:
        """An event destination: ``style`` is ``"snapshot"`` (v1 events) or ``"thin"`` (v2)."""
        return self._call(
            "POST", "/destinations", {"url": url, "secret": secret, "style": style, **options}
        )

    def destinations(self) -> dict[str, Any]:
        return self._call("GET", "/destinations")

    def clear_destinations(self) -> dict[str, Any]:
        return self._call("DELETE", "/destinations")

    def flush_deliveries(self) -> dict[str, Any]:
        return self._call("POST", "/deliveries/flush")

    def issue_error_reports(self) -> dict[str, Any]:
        """Report every pending asynchronous validation error now."""
        return self._call("POST", "/validation/report")

    def _call(self, method: str, route: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(  # noqa: S310 - the emulator's own URL
            f"{self.base_url}/_emulator{route}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
            result: dict[str, Any] = json.load(response)
            return result
