"""``run.status_changed`` at ingest: the words a user sees, announced when events change them.

Ingest is the hot path, so the words are not recomputed for every event. Each run keeps the
words last announced (``runs.announced_status``), and a request recomputes them only for
runs where its fresh events can change them (``metering.policy.status``):

- a run this request created: its events are all in the request, so its words are worked
  out before it is stored and written with the run (no statement of their own);
- a parked run stays "Under review" whatever arrives; a settled run that events reach is
  "settling again"; an unsettled run with a terminal event is "settling": no events read;
- an unsettled run's live words, from its stored events, only when a fresh event is a
  drop, restore or resume (``LIVE_STATUS_TYPES``), or usage reaches a run announced as
  resuming (the only words usage can end), or nothing was announced before (a run stored
  before announcements existed). Plain usage on a running run costs nothing.

Concurrency: the run rows are locked (``UPSERT_RUNS``) before anything here reads them, and
stay locked until commit, so two requests for one run announce one after the other, each
from the words the other committed: a change is never announced twice, nor skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from metering.catalogue import TERMINAL_TYPES, USAGE_TYPE
from metering.history.partitions import RUNS_RECEIVED_SINCE
from metering.ingest.validation import ValidEvent
from metering.notifications.announced import remember_and_record
from metering.notifications.builders import RunRef, status_changed
from metering.policy.facts import EventFact
from metering.policy.status import LIVE_STATUS_TYPES, RESUMING, live_status, run_status


@dataclass(frozen=True, slots=True)
class RunState:
    """A run as ingest found it under its lock, before this request's events."""

    ref: RunRef
    announced: str | None  # the words last announced; for a run created now, its words
    had_events: bool  # False: this request created the run
    decided: bool
    parked: bool
    terminal: bool


def new_run_status(events: Sequence[ValidEvent]) -> str:
    """The words of a run whose events are exactly ``events`` (a run created by them)."""
    return live_status(_facts(events), terminal=any(e.type in TERMINAL_TYPES for e in events))


def _facts(events: Iterable[ValidEvent]) -> list[EventFact]:
    return [EventFact(e.id, e.type, e.time, e.data) for e in events]


# The events ``live_status`` needs to give a run's words: drops, restores and resumes, and
# usage from the last resume on (earlier usage cannot matter: a resume starts over what
# usage may end). Usage at the same time as that resume counts, as it sorts after it.
LIVE_EVENTS = f"""
WITH resumed AS (
    SELECT run_id, max(time) AS at FROM events
    WHERE run_id = ANY(%(ids)s) AND received_at >= {RUNS_RECEIVED_SINCE}
      AND type = 'run.resumed' GROUP BY run_id
)
SELECT e.run_id, e.event_id, e.type, e.time, e.data
FROM events e LEFT JOIN resumed r ON r.run_id = e.run_id
WHERE e.run_id = ANY(%(ids)s) AND e.received_at >= {RUNS_RECEIVED_SINCE}
  AND (e.type = ANY(%(types)s) OR (e.type = '{USAGE_TYPE}' AND e.time >= r.at))
"""


def announce_changes(
    conn: psycopg.Connection[Any],
    runs: Sequence[RunState],
    fresh: dict[int, list[ValidEvent]],
    now: datetime,
) -> None:
    """Record ``run.status_changed`` for each of ``runs`` whose words ``fresh`` events (by
    run id: the ones this request stored) changed, and remember the new words."""
    changes: list[tuple[RunState, str | None, str]] = []  # run, previous words, new words
    reload: list[RunState] = []
    for run in runs:
        events = fresh.get(run.ref.run_id)
        if not events:
            continue
        if not run.had_events:  # created now, stored with its words
            changes.append((run, None, run.announced or new_run_status(events)))
            continue
        words = _words_from_state(run, events)
        if words is None:
            if _live_words_may_change(run, events):
                reload.append(run)
        elif words != run.announced:
            changes.append((run, run.announced, words))
    changes += _live_changes(conn, reload)
    if not changes:
        return
    remember_and_record(
        conn,
        [(r.ref.run_id, words) for r, _, words in changes if r.had_events],
        [status_changed(r.ref, words, old, now) for r, old, words in changes],
    )


def _words_from_state(run: RunState, events: Sequence[ValidEvent]) -> str | None:
    """The run's words when they follow from its state, without reading its events: a
    parked run stays under review, fresh events re-open a settled run, and a run with a
    terminal event is settling until a decision. None: an unsettled run's live words."""
    if run.parked or run.decided:
        return run_status(
            parked=run.parked,
            reopened=True,
            decided=None,
            live=lambda: live_status((), terminal=True),
        )
    if run.terminal or any(e.type in TERMINAL_TYPES for e in events):
        return live_status((), terminal=True)
    return None


def _live_words_may_change(run: RunState, events: Sequence[ValidEvent]) -> bool:
    """Whether ``events`` can change an unsettled run's live words (``LIVE_STATUS_TYPES``;
    usage only ends "resuming"), or nothing was announced for it yet."""
    return (
        run.announced is None
        or any(e.type in LIVE_STATUS_TYPES for e in events)
        or (run.announced == RESUMING and any(e.type == USAGE_TYPE for e in events))
    )


def _live_changes(
    conn: psycopg.Connection[Any], runs: Sequence[RunState]
) -> list[tuple[RunState, str | None, str]]:
    """The live words of unsettled runs, from their stored events (this request's too)."""
    if not runs:
        return []
    rows = conn.execute(
        LIVE_EVENTS, {"ids": [r.ref.run_id for r in runs], "types": sorted(LIVE_STATUS_TYPES)}
    ).fetchall()
    facts: dict[int, list[EventFact]] = {}
    for run_id, *fact in rows:
        facts.setdefault(run_id, []).append(EventFact(*fact))
    changes: list[tuple[RunState, str | None, str]] = []
    for run in runs:
        words = live_status(facts.get(run.ref.run_id, ()), terminal=False)
        if words != run.announced:
            changes.append((run, run.announced, words))
    return changes
