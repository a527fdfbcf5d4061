"""OpenTelemetry traces as a way in (issue #19): GenAI spans → Fairmeter events.

Pure: the HTTP edge (``POST /v1/traces``, a later step) decodes the body with
:func:`decode_otlp_json` or protobuf's own parser, maps it with :func:`map_spans`, and hands
the events to the same ingest as ``POST /v1/events``. The mapping is docs/otlp.md.
"""

from metering.otlp.events import failure_cause
from metering.otlp.json_encoding import decode_otlp_json
from metering.otlp.spans import MappedSpans, RejectedSpan, map_spans

__all__ = ["MappedSpans", "RejectedSpan", "decode_otlp_json", "failure_cause", "map_spans"]
