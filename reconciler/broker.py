"""Which broker carries Celery's tasks, and the settings each one needs.

Redis (the default, and the embedded broker of ``make up``) redelivers a message nobody
acknowledged within its visibility timeout, even while the task still runs, and holds
messages in one unreplicated process. RabbitMQ (an ``amqp://`` broker URL) keeps them in a
quorum queue, replicated by Raft across the cluster's nodes, redelivers only when the
consumer that holds a message is gone, confirms every publish, and counts deliveries: a
message whose worker dies every time it runs it ends in a dead-letter queue instead of
circling forever. Our tasks are idempotent (they re-read the database and lock what they
change), so at-least-once delivery with late acks is what both configurations give.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from kombu import Exchange, Queue

from metering.config import Settings

TASK_QUEUE = "celery"
# Topic, not Celery's default direct exchange: Celery's native delayed delivery (countdown
# and ETA on quorum queues, which cannot hold a task unacked in a worker until it is due)
# routes through topic exchanges. No task of ours uses a countdown today; one added later
# then works on RabbitMQ instead of blocking a worker process until its ETA.
TASK_EXCHANGE = "celery"
DEAD_LETTER_EXCHANGE = "fairmeter.dead-letter"
DEAD_LETTER_QUEUE = f"{TASK_QUEUE}.dead-letter"

TASK_SOFT_TIME_LIMIT_S = 120
TASK_TIME_LIMIT_S = 150

AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp"})


def is_amqp(url: str) -> bool:
    """Whether ``url`` names a RabbitMQ (AMQP 0-9-1) broker."""
    return urlsplit(url).scheme in AMQP_SCHEMES


def dead_letter_queue() -> Queue:
    """Where poison messages wait for an operator: a quorum queue too, so they survive a
    node's loss like the tasks did."""
    exchange = Exchange(DEAD_LETTER_EXCHANGE, type="direct", durable=True)
    return Queue(
        DEAD_LETTER_QUEUE,
        exchange=exchange,
        routing_key=DEAD_LETTER_QUEUE,
        durable=True,
        queue_arguments={"x-queue-type": "quorum"},
    )


class DeadLetteredQueue(Queue):  # type: ignore[misc]
    """The task queue, declaring its dead-letter exchange and queue before itself.

    Whoever declares the task queue first (a worker starting, beat or a task publishing)
    declares where its dead letters go, so a message can never be dead-lettered into an
    exchange that does not exist (RabbitMQ would drop it)."""

    def declare(self, nowait: bool = False, channel: Any = None) -> str:
        if not self.no_declare:
            dead_letter_queue().declare(channel=channel or self.channel)
        name: str = super().declare(nowait=nowait, channel=channel)
        return name


def task_queue(delivery_limit: int) -> Queue:
    """The one task queue on RabbitMQ: quorum, with a delivery limit and a dead letter."""
    return DeadLetteredQueue(
        TASK_QUEUE,
        exchange=Exchange(TASK_EXCHANGE, type="topic", durable=True),
        routing_key=TASK_QUEUE,
        durable=True,
        queue_arguments={
            "x-queue-type": "quorum",
            "x-delivery-limit": delivery_limit,
            "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE,
            "x-dead-letter-routing-key": DEAD_LETTER_QUEUE,
        },
    )


def redis_transport_options(settings: Settings) -> dict[str, int]:
    """Redelivery happens only after the visibility timeout: by default above every task's
    hard limit. A test may set it lower; then unacknowledged messages are also looked for
    every half timeout (kombu's default scan runs only every 100 s)."""
    timeout = settings.broker_visibility_timeout_s
    if timeout is None:
        return {"visibility_timeout": TASK_TIME_LIMIT_S * 4}
    return {
        "visibility_timeout": timeout,
        "unacked_restore_interval": max(1, timeout // 2),
        "unacked_restore_throttle": 1,
    }


def broker_conf(settings: Settings) -> dict[str, Any]:
    """Celery settings that depend on the broker: everything else is the same on both."""
    url = settings.task_broker_url
    if not is_amqp(url):
        return {
            "broker_url": url,
            "broker_transport_options": redis_transport_options(settings),
        }
    return {
        "broker_url": url,
        "task_queues": [task_queue(settings.broker_delivery_limit)],
        "task_default_queue": TASK_QUEUE,
        "task_default_exchange": TASK_EXCHANGE,
        "task_default_exchange_type": "topic",
        "task_default_routing_key": TASK_QUEUE,
        "task_default_queue_type": "quorum",
        "task_create_missing_queue_type": "quorum",
        # Quorum queues refuse global QoS: the worker then sets the prefetch per consumer.
        "worker_detect_quorum_queues": True,
        # A publish returns once RabbitMQ has the message on a quorum of nodes (or fails).
        "broker_transport_options": {"confirm_publish": True},
        "broker_native_delayed_delivery_queue_type": "quorum",
    }
