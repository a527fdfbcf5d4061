"""The what-if use case: a candidate policy over a settled period, read-only.

The replay itself is ``replay.replay_period`` (one process) or
``replay_shards.replay_period_parallel`` (a large period on several); this is where a
request's document and period become a candidate and a month.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from metering.policies.versions import list_versions, parse_over
from metering.policy.document import PolicyDocument
from metering.settlement.replay import WhatIf, replay_period
from metering.settlement.replay_shards import Parallelism, replay_period_parallel
from metering.statements.query import parse_period


def what_if(
    conn: psycopg.Connection[Any],
    tenant: str,
    period: str,
    raw: object,
    defaults: PolicyDocument,
    now: datetime,
    parallelism: Parallelism | None = None,
) -> WhatIf:
    """The what-if of ``raw`` (fields left out keep the latest version's values) over the
    tenant's runs settled in ``period`` (YYYY-MM or "current"); 422 for a bad period or
    document. With ``parallelism``, a large period is replayed on several processes."""
    month = parse_period(period, now)
    latest = list_versions(conn, tenant, defaults)[-1]
    candidate = parse_over(raw, latest.document)
    if parallelism is None:
        return replay_period(conn, tenant, month, candidate, defaults)
    return replay_period_parallel(conn, tenant, month, candidate, defaults, parallelism)
