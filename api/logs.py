"""JSON structured logs, one object per line."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime

from metering.config import Settings

_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
# An API key (its id may stay: it is the handle support looks keys up by) and whatever follows
# "Bearer" or an Authorization header name, wherever they appear in a line.
_KEY = re.compile(r"\b(fm_[a-z]+_)([0-9A-Za-z]+)(_[0-9A-Za-z_]+)?")
_BEARER = re.compile(r"(?i)(bearer\s+|authorization[\"']?\s*[:=,]\s*[\"']?)[^\s\"',;)}\]]+")


def redact(text: str) -> str:
    """``text`` without API key secrets or bearer credentials."""
    return _BEARER.sub(r"\1[REDACTED]", _KEY.sub(_redact_key, text))


def _redact_key(match: re.Match[str]) -> str:
    prefix, key_id, rest = match.groups()
    # A well-formed key keeps its id; a malformed one may be all secret.
    return f"{prefix}{key_id}_[REDACTED]" if rest else f"{prefix}[REDACTED]"


class RedactingFormatter(logging.Formatter):
    """Wraps a formatter so that no line it writes carries a key, whatever was logged."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self._inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return redact(self._inner.format(record))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(settings: Settings) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        RedactingFormatter(JsonFormatter() if settings.log_json else logging.Formatter())
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # their own handlers
        for own in logging.getLogger(name).handlers:
            if not isinstance(own.formatter, RedactingFormatter):
                own.setFormatter(RedactingFormatter(own.formatter or logging.Formatter()))
