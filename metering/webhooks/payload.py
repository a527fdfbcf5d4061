"""The body of a webhook, made once when its message is and sent as stored on every try.

``{"type", "timestamp", "schema_version", "data": {<the notification's own fields>, "run":
<the run as GET /v1/runs/{run} shows it>}}``. ``timestamp`` is when the notification was
recorded; ``data.run`` is the run when the message was made (a moment later), omitted for
notifications about no run (``statement.closed``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from metering.notifications.catalogue import SCHEMA_VERSION


def message_body(
    type_: str, timestamp: datetime, data: dict[str, Any], run: dict[str, Any] | None
) -> bytes:
    """The frozen UTF-8 JSON body."""
    fields = dict(data)
    if run is not None:
        fields["run"] = run
    return msgspec.json.encode(
        {"type": type_, "timestamp": timestamp, "schema_version": SCHEMA_VERSION, "data": fields}
    )
