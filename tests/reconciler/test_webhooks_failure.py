"""Giving up, with time driven through the settings: a message whose every attempt fails is
failed after the schedule's last wait, and an endpoint failing for the disable period is
disabled with a reason its admin reads. The failures are the SSRF guard at delivery time:
the worker runs with private targets refused, and the endpoint's name resolves to loopback
(as a name that was public when the endpoint was made may later), so nothing is sent."""

from __future__ import annotations

import time

import pytest

from tests.helpers.events import auth, usage
from tests.helpers.ingest import ingest
from tests.helpers.webhooks import Receiver, add_endpoint, messages, notify, wait_for

pytestmark = pytest.mark.timeout(300)

WORKER_ENV = {
    "FAIRMETER_WEBHOOKS_ALLOW_PRIVATE": "false",
    "FAIRMETER_WEBHOOKS_RETRY_SCHEDULE_S": "[0.3, 0.3]",  # three attempts
    "FAIRMETER_WEBHOOKS_DISABLE_AFTER_S": "6",  # well after three attempts, even loaded
}


def test_every_attempt_refused_fails_the_message_then_disables_the_endpoint(
    webhook_worker, engine, settings, db, client, make_key
):
    ingest(engine, settings, [usage(run="run-1", customer="cust-1")])
    admin = auth(make_key(scope="admin"))
    with Receiver() as receiver:
        endpoint_id, _ = add_endpoint(engine, settings, f"https://localhost:{receiver.port}/h")
        notify(engine, "run.settled", run="run-1")
        wait_for(lambda: [m[3] for m in messages(db)] == ["failed"])
        attempts = db.execute(
            "SELECT attempt, outcome, status_code, error FROM webhook_attempts ORDER BY attempt"
        ).fetchall()
        assert [a[:3] for a in attempts] == [(i, "failed", None) for i in (1, 2, 3)]
        assert all("refused: localhost resolves to 127.0.0.1" in a[3] for a in attempts)
        log = client.get(f"/v1/webhooks/endpoints/{endpoint_id}/deliveries", headers=admin).json()
        [delivery] = log["deliveries"]
        assert (delivery["status"], delivery["next_attempt_at"]) == ("failed", None)
        assert len(delivery["attempts"]) == 3
        assert "loopback" in delivery["attempts"][0]["error"]
        shown = client.get(f"/v1/webhooks/endpoints/{endpoint_id}", headers=admin).json()
        assert shown["enabled"] is True  # failing, but not for long enough yet

        # Past the disable period from the first failure, on the database's clock (the
        # worker's first attempt may come seconds after the notification on a loaded host).
        [(left_s,)] = db.execute(
            "SELECT extract(epoch FROM failing_since + interval '6.5 seconds' - now()) "
            "FROM webhook_endpoints"
        ).fetchall()
        time.sleep(max(0.0, float(left_s)))
        notify(engine, "run.resettled", run="run-1")  # still failing, 6 s on
        wait_for(lambda: db.execute("SELECT NOT enabled FROM webhook_endpoints").fetchone()[0], 60)
        shown = client.get(f"/v1/webhooks/endpoints/{endpoint_id}", headers=admin).json()
        assert shown["enabled"] is False
        assert shown["disabled_reason"].startswith("every delivery attempt failed for")
        assert shown["disabled_at"] is not None

        notify(engine, "run.held", run="run-1")  # a disabled endpoint is told nothing
        time.sleep(3)
        assert len(messages(db)) == 2
    assert receiver.requests == []  # the guard refused before connecting, every time
