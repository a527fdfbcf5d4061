"""The what-if use case: a candidate policy over a settled period, read-only.

The replay itself is ``replay.replay_period`` (in the calling process) or
``replay_shards.replay_period_parallel`` (on worker processes); this is where a
request's document and period become a candidate and a month.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg

from metering.policies.versions import list_versions, parse_over
from metering.policy.document import PolicyDocument
from metering.settlement.replay import WhatIf, replay_period
from metering.settlement.replay_shards import (
    Parallelism,
    never_cancelled,
    replay_period_parallel,
)
from metering.statements.query import parse_period


def what_if(
    conn: psycopg.Connection[Any],
    tenant: str,
    period: str,
    raw: object,
    defaults: PolicyDocument,
    now: datetime,
    parallelism: Parallelism | None = None,
    cancelled: Callable[[], bool] = never_cancelled,
) -> WhatIf:
    """The what-if of ``raw`` (fields left out keep the latest version's values) over the
    tenant's runs settled in ``period`` (YYYY-MM or "current"); 422 for a bad period or
    document. With ``parallelism``, the period is replayed as it says (on workers, a large
    one on several), and abandoned with ``QueryCanceled`` once ``cancelled()`` is true."""
    month = parse_period(period, now)
    latest = list_versions(conn, tenant, defaults)[-1]
    candidate = parse_over(raw, latest.document)
    if parallelism is None:
        return replay_period(conn, tenant, month, candidate, defaults)
    return replay_period_parallel(conn, tenant, month, candidate, defaults, parallelism, cancelled)
