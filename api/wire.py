"""Wire types: what the API returns. Never table rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec


class EventResult(msgspec.Struct):
    source: str
    id: str
    result: str


class IngestReply(msgspec.Struct):
    accepted: int
    duplicates: int
    events: list[EventResult]


class DecisionReply(msgspec.Struct):
    version: int
    origin: str
    outcome: str
    status: str
    gross_micros: int
    billed_micros: int
    credited_micros: int
    rule_ids: list[str]
    evidence_event_ids: list[str]
    explanation: str
    period: str
    decided_at: datetime
    policy_version: int  # the tenant's policy version that made it (0: the settings)


class RunReply(msgspec.Struct):
    run: str
    customer: str
    status: str
    outcome: str | None
    gross_micros: int
    billed_micros: int | None
    credited_micros: int | None
    # gross = billed + credited + held at every moment: the whole gross while held for
    # review, plus any usage that arrived after the decision in force.
    held_micros: int | None
    tentative_micros: int  # usage no decision has seen yet (late usage once re-opened)
    rule_ids: list[str]
    explanation: str | None
    policy_version: int | None  # of the decision in force (docs/policies.md)
    decisions: list[DecisionReply]
    event_count: int
    event_counts: dict[str, int]
    attempts: int
    first_event_at: datetime
    last_event_at: datetime
    last_received_at: datetime
    terminal_at: datetime | None
    settled: bool
    reopened: bool
    # "cloudevents" or "otlp": the one protocol the run's usage comes through (docs/otlp.md,
    # "One path per run"); null before any usage.
    usage_protocol: str | None = None


class Health(msgspec.Struct):
    status: str
    checks: dict[str, str] = msgspec.field(default_factory=dict)


class TotalsReply(msgspec.Struct):
    gross_micros: int
    billed_micros: int
    credited_micros: int
    held_micros: int
    runs: int
    runs_restored: int
    corrections: int


class StatementLineReply(msgspec.Struct):
    kind: str
    run: str
    version: int
    started_at: datetime
    ended_at: datetime
    models: list[str]
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    gross_micros: int
    billed_micros: int
    credited_micros: int
    outcome: str
    status: str
    explanation: str
    corrects_period: str | None
    stripe: str


class InvoiceTotalsReply(msgspec.Struct):
    """The totals in the customer's billing currency, as its invoice counts them."""

    currency: str  # ISO 4217, lowercase, as Stripe writes it
    unit_amount_decimal: str  # the price of one meter unit in minor units, as Stripe gives it
    rate_since: datetime  # when that price was learned (the latest wins)
    billed_minor: int  # = the period's invoice less its credit notes
    credited_minor: int
    billed: str  # "1.03 EUR"
    credited: str


class StatementReply(msgspec.Struct):
    customer: str
    period: str
    closed: bool
    totals: TotalsReply
    lines: list[StatementLineReply]
    next_cursor: str | None
    invoice: InvoiceTotalsReply | None = None  # null while the currency is not known
    invoice_note: str | None = None  # why ``invoice`` is null, for people


class StreamEvent(msgspec.Struct):
    """The ``data:`` of one Server-Sent Event of a live status stream: a notification
    (``data`` is its own fields, docs/events.md), or the stream's opening snapshot
    (``run.status``: ``data`` is the run as ``GET /v1/runs/{run}`` shows it)."""

    type: str
    id: int
    run: str | None
    customer: str
    created_at: datetime
    schema_version: str
    data: Any
