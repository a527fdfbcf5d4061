"""The event catalogue of docs/events.md: which ``data`` fields each event type takes.

Unknown ``data`` fields are refused: a typo such as ``output_token`` would otherwise be
silently dropped and the run under-billed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MAX_COUNT: Final = 10**12  # tokens in one event; far above any real model call
MAX_STEP: Final = 10**9
MAX_TEXT: Final = 255


@dataclass(frozen=True, slots=True)
class FieldSpec:
    kind: str  # "count" | "step" | "attempt" | "text" | "bool" | "choice"
    required: bool = True
    choices: tuple[str, ...] = ()


def _choice(*choices: str, required: bool = True) -> FieldSpec:
    return FieldSpec("choice", required, choices)


OPTIONAL_ATTEMPT = FieldSpec("attempt", required=False)

EVENT_TYPES: Final[dict[str, dict[str, FieldSpec]]] = {
    "run.started": {"attempt": OPTIONAL_ATTEMPT},
    "run.usage": {
        "step": FieldSpec("step"),
        "attempt": OPTIONAL_ATTEMPT,
        "model": FieldSpec("text"),
        "input_tokens": FieldSpec("count"),
        "cached_input_tokens": FieldSpec("count", required=False),
        "output_tokens": FieldSpec("count"),
        "tool_call_id": FieldSpec("text", required=False),
        "replay": FieldSpec("bool", required=False),
    },
    "run.checkpoint": {
        "checkpoint_id": FieldSpec("text"),
        "step": FieldSpec("step"),
        "attempt": OPTIONAL_ATTEMPT,
    },
    "run.delivered": {
        "step": FieldSpec("step"),
        "kind": _choice("final", "partial", "changes"),
        "attempt": OPTIONAL_ATTEMPT,
    },
    "run.tool_call": {
        "tool_call_id": FieldSpec("text"),
        "step": FieldSpec("step"),
        "status": _choice("completed", "failed"),
        "attempt": OPTIONAL_ATTEMPT,
    },
    "connection.lost": {
        "side": _choice("server", "client"),
        "reason": FieldSpec("text", required=False),
        "attempt": OPTIONAL_ATTEMPT,
    },
    "connection.restored": {
        "side": _choice("server", "client"),
        "reason": FieldSpec("text", required=False),
        "attempt": OPTIONAL_ATTEMPT,
    },
    "run.resumed": {
        "attempt": FieldSpec("attempt"),
        "from_checkpoint": FieldSpec("text", required=False),
    },
    "run.completed": {"attempt": OPTIONAL_ATTEMPT},
    "run.cancelled": {"by": _choice("user", "system"), "attempt": OPTIONAL_ATTEMPT},
    "run.failed": {
        "cause": _choice("network", "server", "provider", "tool", "client", "unknown"),
        "attempt": OPTIONAL_ATTEMPT,
    },
    "run.heartbeat": {"attempt": OPTIONAL_ATTEMPT},
}

TERMINAL_TYPES: Final = frozenset({"run.completed", "run.cancelled", "run.failed"})
USAGE_TYPE: Final = "run.usage"
# The ingest protocols usage arrives through (POST /v1/events, POST /v1/traces): a run's
# usage must all come through one of them (``metering.ingest.protocol``).
CLOUDEVENTS: Final = "cloudevents"
OTLP: Final = "otlp"
