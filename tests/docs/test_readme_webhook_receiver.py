"""The README's webhook receiver, run as written, gets a webhook the product delivered and
refuses a forged one (issue #16)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime

import httpx

from metering.policy.status import AGENT_RUNNING
from metering.webhooks.delivery import deliver_due
from metering.webhooks.fanout import fan_out_pending
from reconciler.webhook_sender import WebhookSender
from tests.helpers import ROOT
from tests.helpers.events import usage
from tests.helpers.ingest import ingest
from tests.helpers.processes import free_port, wait_until
from tests.helpers.webhooks import add_endpoint, messages, notify


def receiver_block() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    return next(b for b in blocks if "fairmeter_client.webhooks" in b)


def now() -> datetime:
    return datetime.now(UTC)


def test_the_readme_receiver_verifies_a_delivered_webhook_and_refuses_a_forged_one(
    engine, settings, db
):
    port = free_port()
    script = receiver_block().replace('("", 8080)', f'("127.0.0.1", {port})')
    assert script != receiver_block()
    ingest(engine, settings, [usage(run="run-1", customer="cust-1")])
    _, secret = add_endpoint(engine, settings, f"http://127.0.0.1:{port}/")
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "FAIRMETER_WEBHOOK_SECRET": secret},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_until(lambda: _listening(port), 120)
        notify(engine, "run.settled", run="run-1")
        allowed = settings.model_copy(update={"webhooks_allow_private": True})
        assert fan_out_pending(engine, allowed, now) == 1
        sender = WebhookSender()
        assert deliver_due(engine, allowed, sender, now) == 1
        sender.close()
        assert [m[3] for m in messages(db)] == ["delivered"]
        forged = httpx.post(
            f"http://127.0.0.1:{port}/",
            content=b'{"type": "run.settled", "data": {}}',
            headers={"webhook-id": "msg_x", "webhook-timestamp": "1", "webhook-signature": "v1,x"},
        )
        assert forged.status_code == 400
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert out.splitlines() == [f"run.settled run-1 {AGENT_RUNNING}"]


def _listening(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
    except httpx.HTTPError:
        return False
    return True
