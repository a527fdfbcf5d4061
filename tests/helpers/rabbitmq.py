"""The machine's RabbitMQ (127.0.0.1:5672, guest/guest), a private virtual host per test.

Nothing is started here: the broker is a service of the machine like PostgreSQL (``.ci/run``
starts it when it is down). A test gets a virtual host of its own, created and deleted
with ``rabbitmqctl``, so its queues, messages and connections never meet another test's,
and a fault it injects (closing every connection) stays inside it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from urllib.parse import quote

import amqp

# Restarting the node drops every client of the machine's broker, not only a test's: only
# where the broker is the tests' own (``.ci/run`` sets this when it started RabbitMQ).
RESTART_ALLOWED = os.environ.get("FAIRMETER_TEST_RABBITMQ_RESTART") == "1"
HOST = os.environ.get("FAIRMETER_TEST_RABBITMQ_HOST", "127.0.0.1:5672")
USER = os.environ.get("FAIRMETER_TEST_RABBITMQ_USER", "guest")
PASSWORD = os.environ.get("FAIRMETER_TEST_RABBITMQ_PASSWORD", "guest")


def rabbitmqctl_missing() -> str | None:
    """Why the RabbitMQ tests cannot run here, or None."""
    if shutil.which("rabbitmqctl") is None:
        return "rabbitmqctl is not installed"
    try:
        amqp.Connection(HOST, userid=USER, password=PASSWORD, connect_timeout=3).connect()
    except (OSError, amqp.exceptions.AMQPError) as exc:
        return f"RabbitMQ does not answer on {HOST}: {exc}"
    return None


def rabbitmqctl(*argv: str, timeout_s: float = 60) -> str:
    done = subprocess.run(
        ["rabbitmqctl", "--quiet", *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(argv)}: {done.stderr or done.stdout}")
    return done.stdout


def restart_node(down_s: float = 3.0) -> None:
    """Stop the RabbitMQ application of the node, leave it down ``down_s``, start it again
    and wait until it serves: quorum queues recover their messages from their Raft logs."""
    rabbitmqctl("stop_app", timeout_s=120)
    try:
        time.sleep(down_s)
    finally:
        rabbitmqctl("start_app", timeout_s=180)
        rabbitmqctl("await_startup", timeout_s=180)


class RabbitVhost:
    """A virtual host of its own on the machine's RabbitMQ."""

    def __init__(self) -> None:
        self.name = f"fairmeter-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def url(self) -> str:
        return f"amqp://{USER}:{PASSWORD}@{HOST}/{quote(self.name, safe='')}"

    def create(self) -> None:
        rabbitmqctl("add_vhost", self.name)
        rabbitmqctl("set_permissions", "-p", self.name, USER, ".*", ".*", ".*")

    def delete(self) -> None:
        rabbitmqctl("delete_vhost", self.name)

    def close_all_connections(self, why: str = "fault injected by a test") -> None:
        """What a broker restart does to its clients: every connection of this vhost is
        closed by the server, unacknowledged deliveries go back to their queues."""
        rabbitmqctl("close_all_connections", "--vhost", self.name, why)

    def depth(self, queue: str) -> tuple[int, int]:
        """(messages ready, consumers) of ``queue``; (0, 0) while it is not declared."""
        conn = amqp.Connection(
            HOST, userid=USER, password=PASSWORD, virtual_host=self.name, connect_timeout=5
        )
        conn.connect()
        try:
            channel = conn.channel()
            try:
                _, ready, consumers = channel.queue_declare(queue, passive=True)
            except amqp.exceptions.NotFound:
                return 0, 0
            return int(ready), int(consumers)
        finally:
            conn.close()

    def queues(self) -> dict[str, dict[str, str]]:
        """Per queue of the vhost: its type and message counts, as rabbitmqctl lists them."""
        out = rabbitmqctl(
            "list_queues",
            "-p",
            self.name,
            "--no-table-headers",
            "name",
            "type",
            "messages",
            "messages_unacknowledged",
        )
        rows = [line.split("\t") for line in out.splitlines() if line.strip()]
        return {
            name: {"type": kind, "messages": total, "unacked": unacked}
            for name, kind, total, unacked in rows
        }
