"""Settlement against the real database: decisions, versions, ledger postings, late evidence."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from metering.db import raw_transaction
from metering.settlement.runner import settle_chunk, settle_due_now
from metering.settlement.settle import settle_runs
from tests.helpers.events import event, usage
from tests.helpers.ingest import ingest

NOW = datetime.now(UTC).replace(microsecond=0)
T0 = NOW - timedelta(hours=2)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def run_id(db: Any, subject: str = "run-1") -> int:
    return int(db.execute("SELECT id FROM runs WHERE subject = %s", (subject,)).fetchone()[0])


def position(db: Any, subject: str = "run-1") -> dict[str, int]:
    rows = db.execute(
        "SELECT kind, coalesce(corrects, ''), sum(amount_micros) FROM ledger_entries l "
        "JOIN runs r ON r.id = l.run_id WHERE r.subject = %s GROUP BY 1, 2",
        (subject,),
    ).fetchall()
    sums = {(k, c): int(s) for k, c, s in rows}
    return {
        "gross": sums.get(("hold", ""), 0),
        "billed": sums.get(("post", ""), 0) + sums.get(("correction", "billed"), 0),
        "credited": sums.get(("release", ""), 0) + sums.get(("correction", "credited"), 0),
    }


def decisions(db: Any, subject: str = "run-1") -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT d.version, d.outcome, d.billed_micros, d.credited_micros, d.rule_ids "
        "FROM decisions d JOIN runs r ON r.id = d.run_id WHERE r.subject = %s ORDER BY version",
        (subject,),
    ).fetchall()


def refunded_run_events() -> list[dict[str, Any]]:
    """A run cut by a server-side drop before anything was delivered: R4 refunds it all."""
    return [
        event(type="run.started", time=at(0), attempt=1),
        usage(step=1, input_tokens=1000, output_tokens=500, time=at(1)),
        usage(step=2, input_tokens=2000, output_tokens=100, time=at(2)),
        event(type="connection.lost", side="server", reason="lb reset", time=at(3)),
        event(type="run.failed", cause="network", time=at(4)),
    ]


def test_completed_run_is_confirmed_and_posted(engine, settings, db):
    ingest(engine, settings, [usage(step=1, time=at(1)), event(type="run.completed", time=at(2))])
    report = settle_due_now(engine, settings, now=NOW)
    assert list(report.decided.values()) == [1]
    assert decisions(db) == [(1, "confirmed", 10_500, 0, ["R0"])]
    assert position(db) == {"gross": 10_500, "billed": 10_500, "credited": 0}


def test_failed_run_with_server_drop_and_no_delivery_is_refunded(engine, settings, db):
    ingest(engine, settings, refunded_run_events())
    settle_due_now(engine, settings, now=NOW)
    ((_version, outcome, billed, credited, rules),) = decisions(db)
    assert (outcome, billed, credited) == ("refunded", 0, 18_000)
    assert "R4" in rules
    assert position(db) == {"gross": 18_000, "billed": 0, "credited": 18_000}
    status = db.execute("SELECT status FROM runs").fetchone()[0]
    assert status == "Run failed — usage restored"


def test_settling_again_without_new_evidence_adds_no_version(engine, settings, db):
    ingest(engine, settings, refunded_run_events())
    settle_due_now(engine, settings, now=NOW)
    rid = run_id(db)
    for _ in range(3):
        report = settle_chunk(engine, settings, [rid], now=NOW)
        assert report.decided == {}
        with raw_transaction(engine) as conn:
            assert settle_runs(conn, [rid], now=NOW, settings=settings, force=True).decided == {}
    assert len(decisions(db)) == 1


def test_fifty_concurrent_settle_calls_make_one_decision(engine, settings, db):
    ingest(engine, settings, refunded_run_events())
    rid = run_id(db)

    def settle_once(_: int) -> int:
        with raw_transaction(engine) as conn:
            return len(settle_runs(conn, [rid], now=NOW, settings=settings, force=True).decided)

    with ThreadPoolExecutor(max_workers=8) as pool:
        made = sum(pool.map(settle_once, range(50)))
    assert made == 1
    assert len(decisions(db)) == 1
    assert position(db)["credited"] == 18_000


def test_late_delivery_reopens_a_refunded_run_and_corrects_it(engine, settings, db):
    ingest(engine, settings, refunded_run_events())
    settle_due_now(engine, settings, now=NOW)
    assert decisions(db)[0][1] == "refunded"
    # Late evidence: step 1's output had reached the user before the drop.
    ingest(engine, settings, [event(type="run.delivered", step=1, kind="partial", time=at(1.5))])
    reopened = db.execute("SELECT settled_evidence_version < evidence_version FROM runs")
    assert reopened.fetchone() == (True,)
    settle_due_now(engine, settings, now=NOW)
    history = decisions(db)
    assert [d[0] for d in history] == [1, 2]
    assert history[0][1] == "refunded"  # the old version is kept, never edited
    assert history[1][1:4] == ("partially_credited", 10_500, 7_500)
    assert position(db) == {"gross": 18_000, "billed": 10_500, "credited": 7_500}
    corrections = db.execute(
        "SELECT corrects, amount_micros FROM ledger_entries WHERE kind = 'correction' "
        "ORDER BY corrects"
    ).fetchall()
    assert corrections == [("billed", 10_500), ("credited", -10_500)]


def test_late_event_that_changes_nothing_adds_no_version(engine, settings, db):
    ingest(engine, settings, refunded_run_events())
    settle_due_now(engine, settings, now=NOW)
    ingest(engine, settings, [event(type="run.heartbeat", time=at(3.5))])
    settle_due_now(engine, settings, now=NOW)
    assert len(decisions(db)) == 1
    assert db.execute(
        "SELECT settled_evidence_version = evidence_version FROM runs"
    ).fetchone() == (True,)


def test_run_without_terminal_event_is_settled_as_abandoned_after_idle_timeout(
    engine, settings, db
):
    ingest(
        engine,
        settings,
        [usage(step=1, time=at(0)), event(type="connection.lost", side="server", time=at(1))],
    )
    settle_due_now(engine, settings, now=NOW)
    ((_, outcome, billed, credited, _rules),) = decisions(db)
    assert (outcome, billed, credited) == ("refunded", 0, 10_500)


def test_unverified_abandoned_run_is_held_and_nothing_is_posted(engine, settings, db):
    ingest(
        engine,
        settings,
        [usage(step=1, time=at(0)), event(type="connection.lost", side="client", time=at(1))],
    )
    settle_due_now(engine, settings, now=NOW)
    assert decisions(db)[0][1] == "held_for_review"
    assert position(db) == {"gross": 10_500, "billed": 0, "credited": 0}
    assert db.execute("SELECT status FROM runs").fetchone() == ("Under review",)


def test_ledger_reconciles_per_customer_after_mixed_runs(engine, settings, db):
    for i in range(5):
        ingest(
            engine,
            settings,
            [
                usage(run=f"ok-{i}", customer=f"c{i % 2}", step=1, time=at(1)),
                event(run=f"ok-{i}", customer=f"c{i % 2}", type="run.completed", time=at(2)),
            ],
        )
        ingest(
            engine,
            settings,
            [
                {
                    **e,
                    "subject": f"bad-{i}",
                    "id": f"{e['id']}-{i}",
                    "data": {**e["data"], "customer": f"c{i % 2}"},
                }
                for e in refunded_run_events()
            ],
        )
    settle_due_now(engine, settings, now=NOW)
    rows = db.execute(
        "SELECT customer_id, "
        "sum(amount_micros) FILTER (WHERE kind = 'hold'), "
        "sum(amount_micros) FILTER (WHERE kind = 'post' OR corrects = 'billed'), "
        "sum(amount_micros) FILTER (WHERE kind = 'release' OR corrects = 'credited') "
        "FROM ledger_entries GROUP BY customer_id"
    ).fetchall()
    assert len(rows) == 2
    for _, gross, billed, credited in rows:
        assert gross == billed + credited


def test_decision_array_literals_keep_any_text_through_copy(db: Any) -> None:
    # Model names and event ids are free text; the literals insert_decisions writes must give
    # back exactly the elements it was handed, whatever characters they contain.
    from metering.settlement.repo import _int_array, _text_array

    texts = ["a", 'q"uote', "back\\slash", "c,omma", "{brace}", "NULL", "", " sp ", "t\tn\n", "ü"]
    ints = [0, -5, 10**15]
    db.execute("CREATE TEMP TABLE arrays (texts text[], ints bigint[])")
    with db.cursor() as cur, cur.copy("COPY arrays (texts, ints) FROM STDIN") as copy:
        copy.write_row((_text_array(texts), _int_array(ints)))
        copy.write_row((_text_array([]), _int_array([])))
    rows = db.execute("SELECT texts, ints FROM arrays").fetchall()
    assert rows == [(texts, ints), ([], [])]
