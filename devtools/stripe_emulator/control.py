"""The emulator's own control API under ``/_emulator/`` (JSON in, JSON out; not Stripe's).

- ``GET  /_emulator/health``: ``{"ok": true}``.
- ``GET  /_emulator/state``: everything in memory (see ``EmulatorState.snapshot``), the
  fault plan and the number of idempotency keys kept.
- ``POST /_emulator/clock``: ``{"now": unix, "frozen": false}`` or ``{"advance_s": n}``.
- ``POST /_emulator/faults``: replace the plan, e.g. ``{"next": ["500", "drop_after_commit"],
  "path": "/v1/billing/meter_events"}`` or ``{"rate": 0.3, "kinds": [...], "seed": 1}``.
- ``DELETE /_emulator/faults``: no more faults.
- ``POST /_emulator/settings``: change ``EmulatorSettings`` fields.
- ``POST /_emulator/reset``: forget everything (objects, keys, faults, settings, clock).
- Billing: ``POST /subscriptions``, ``POST /invoicing/run``, ``POST /invoices/{id}/pay``,
  ``POST|GET|DELETE /destinations``, ``POST /deliveries/flush``, ``POST /validation/report``
  (``control_billing``; README.md documents them). Every non-GET call ends by delivering the
  queued events when ``auto_deliver`` is on.
- ``POST /_emulator/webhooks``: deliver one signed event, ``times`` times. Body: ``url`` and
  ``secret`` (default: the settings' webhook_url / webhook_secret), ``signed_at`` (optional),
  and either ``event`` (a full event object) or ``type`` = ``invoice.finalized`` (with
  ``customer``, ``period_start``, ``period_end``, ``amount_due``, ``invoice`` overrides) or
  ``v1.billing.meter.error_report_triggered`` (with ``meter``, ``errors``, ``inline_data``).
"""

from __future__ import annotations

import json
from typing import Any

from devtools.stripe_emulator import control_billing, destinations, errors, webhooks
from devtools.stripe_emulator.pipeline import Emulator, Reply, json_reply
from devtools.stripe_emulator.state import new_id

PREFIX = "/_emulator"


class ControlError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def handle_control(emulator: Emulator, method: str, path: str, body: str) -> Reply:
    try:
        data = _json_object(body) if method == "POST" else {}
        answer = _dispatch(emulator, method, path[len(PREFIX) :], data)
        if method != "GET" and emulator.state.settings.auto_deliver:
            # Deliver what the call made due, here and not inside a Stripe API request.
            destinations.flush(emulator.state)
        return json_reply(200, answer)
    except ControlError as exc:
        return json_reply(exc.status, {"error": {"message": str(exc)}})
    except errors.StripeError as exc:
        return json_reply(exc.status, {"error": {"message": exc.message}})
    except (ValueError, TypeError, KeyError) as exc:
        return json_reply(400, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
    except LookupError as exc:
        return json_reply(404, {"error": {"message": str(exc)}})


def _dispatch(emulator: Emulator, method: str, route: str, data: dict[str, Any]) -> Any:
    state = emulator.state
    if (method, route) == ("GET", "/health"):
        return {"ok": True}
    if (method, route) == ("GET", "/state"):
        snapshot = state.snapshot()
        snapshot["faults"] = emulator.faults.describe()
        snapshot["idempotency_keys"] = len(emulator.idempotency)
        return snapshot
    if (method, route) == ("POST", "/clock"):
        return _move_clock(emulator, data)
    if (method, route) == ("POST", "/faults"):
        emulator.faults.configure(data)
        return emulator.faults.describe()
    if (method, route) == ("DELETE", "/faults"):
        emulator.faults.clear()
        return emulator.faults.describe()
    if (method, route) == ("POST", "/settings"):
        with state.lock:
            state.settings.update(data)
            return state.settings.as_dict()
    if (method, route) == ("POST", "/reset"):
        emulator.reset()
        return {"ok": True}
    if (method, route) == ("POST", "/webhooks"):
        return _deliver(emulator, data)
    answer = control_billing.dispatch(state, method, route, data)
    if answer is not None:
        return answer
    raise ControlError(404, f"no control endpoint {method} {PREFIX}{route}")


def _move_clock(emulator: Emulator, data: dict[str, Any]) -> dict[str, Any]:
    clock = emulator.state.clock
    if "now" in data:
        clock.set(float(data["now"]), frozen=bool(data.get("frozen", False)))
    elif "advance_s" in data:
        clock.advance(float(data["advance_s"]))
    else:
        raise ControlError(400, "give 'now' (unix seconds) or 'advance_s'")
    # Moving time makes invoices and error reports due; they are delivered after the call.
    return {**clock.describe(), "due": control_billing.run_due(emulator.state)}


def _deliver(emulator: Emulator, data: dict[str, Any]) -> dict[str, Any]:
    state = emulator.state
    url = data.get("url") or state.settings.webhook_url
    secret = data.get("secret") or state.settings.webhook_secret
    if not url or not secret:
        raise ControlError(400, "no webhook url/secret given or configured in settings")
    event = _build_event(emulator, data)
    outcomes = webhooks.deliver(
        state, url, secret, event, times=int(data.get("times", 1)), signed_at=data.get("signed_at")
    )
    return {"event": event, "deliveries": outcomes}


def _build_event(emulator: Emulator, data: dict[str, Any]) -> dict[str, Any]:
    state = emulator.state
    if "event" in data:
        event = dict(data["event"])
        event.setdefault("id", new_id("evt"))
        with state.lock:
            state.events[event["id"]] = event
        return event
    kind = data.get("type")
    if kind == "invoice.finalized":
        if "customer" not in data:
            raise ControlError(400, "invoice.finalized needs 'customer'")
        return webhooks.invoice_finalized(state, data)
    if kind == webhooks.ERROR_REPORT:
        notification, _ = webhooks.meter_error_report(state, data)
        return notification
    raise ControlError(400, f"give 'event' or a known 'type', not {kind!r}")


def _json_object(body: str) -> dict[str, Any]:
    if not body.strip():
        return {}
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ControlError(400, "the body must be a JSON object")
    return data
