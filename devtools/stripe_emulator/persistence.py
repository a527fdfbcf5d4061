"""The emulator's objects kept in a file across restarts, for ``fairmeter up``.

Our database keeps the Stripe customer ids the demo linked; an emulator that forgot them on
every start answered the second ``make up``'s meter events with
``meter_event_customer_not_found`` (issue #15 §5). Stripe never forgets a customer, so
neither does the emulator when it is given a state file: meters, customers, meter events,
balance transactions and invoices are loaded at start and written back (atomically) every
few seconds while they change, and once more on stop. Settings, counters, the clock and
in-flight locks are per process and are not kept.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from devtools.stripe_emulator.state import (
    BalanceTransaction,
    Customer,
    EmulatorState,
    Meter,
    MeterEvent,
)

SAVE_INTERVAL_S = 2.0


def document(state: EmulatorState) -> dict[str, Any]:
    """The objects Stripe would still have after a restart, JSON-ready."""
    with state.lock:
        return {
            "meters": [asdict(meter) for meter in state.meters.values()],
            "customers": [asdict(customer) for customer in state.customers.values()],
            "meter_events": [asdict(event) for event in state.meter_events],
            "balance_transactions": [
                asdict(txn) for txns in state.balance_transactions.values() for txn in txns
            ],
            "invoices": list(state.invoices.values()),
        }


def restore(state: EmulatorState, saved: dict[str, Any]) -> None:
    """Put saved objects back, with the indexes the operations look them up by."""
    with state.lock:
        for row in saved.get("meters", []):
            meter = Meter(**row)
            state.meters[meter.id] = meter
            state.meters_by_event[meter.event_name] = meter
        for row in saved.get("customers", []):
            customer = Customer(**row)
            state.customers[customer.id] = customer
        for row in saved.get("meter_events", []):
            state.add_meter_event(MeterEvent(**row))
        for row in saved.get("balance_transactions", []):
            txn = BalanceTransaction(**row)
            state.balance_transactions.setdefault(txn.customer, []).append(txn)
        for invoice in saved.get("invoices", []):
            state.invoices[invoice["id"]] = invoice


def load(state: EmulatorState, path: Path) -> int:
    """Restore from ``path`` if it exists; the number of customers restored."""
    if not path.exists():
        return 0
    restore(state, json.loads(path.read_text()))
    return len(state.customers)


def save(state: EmulatorState, path: Path) -> str:
    """Write the objects atomically; returns the text written (to skip unchanged saves)."""
    text = json.dumps(document(state), sort_keys=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(text)
    os.replace(partial, path)
    return text


class Keeper:
    """Saves the state every SAVE_INTERVAL_S while it changes, and once more at ``close``."""

    def __init__(self, state: EmulatorState, path: Path) -> None:
        self.state, self.path = state, path
        self._last = ""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="emulator-keeper", daemon=True)
        self._thread.start()

    def _save_if_changed(self) -> None:
        text = json.dumps(document(self.state), sort_keys=True)
        if text != self._last:
            self._last = save(self.state, self.path)

    def _run(self) -> None:
        while not self._stopping.wait(SAVE_INTERVAL_S):
            self._save_if_changed()

    def close(self) -> None:
        self._stopping.set()
        self._thread.join()
        self._save_if_changed()
