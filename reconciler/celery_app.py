"""The Celery application: settings chosen for at-least-once, idempotent tasks.

Tasks re-check the database before acting, so acks-late redelivery is safe; results are
never stored (nothing reads them). The broker is Redis or RabbitMQ (reconciler/broker.py).
"""

from __future__ import annotations

import sys
from typing import Any

from celery import Celery, beat
from celery.signals import beat_init, worker_init, worker_process_init

from metering.config import Settings, WeakPepperError, load_settings, require_strong_pepper
from metering.heap import freeze_startup_heap
from reconciler.broker import TASK_SOFT_TIME_LIMIT_S, TASK_TIME_LIMIT_S, broker_conf


def create_celery(settings: Settings | None = None) -> Celery:
    settings = settings or load_settings()
    app = Celery("fairmeter", broker=settings.task_broker_url, include=["reconciler.tasks"])
    app.conf.update(
        # A task is acknowledged when it ends, and put back when its worker process dies:
        # a chunk half settled by a killed process runs again (its transaction rolled back).
        # On RabbitMQ the quorum queue's delivery limit ends that loop for a poison message.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # One message per process at a time: a long settlement chunk never holds others
        # hostage in a busy worker's prefetch while idle workers wait.
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_soft_time_limit=TASK_SOFT_TIME_LIMIT_S,
        task_time_limit=TASK_TIME_LIMIT_S,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        timezone="UTC",
        beat_schedule={
            "sweep-due-runs": {
                "task": "fairmeter.sweep_due_runs",
                "schedule": settings.sweep_interval_s,
                # A sweep older than one interval is stale: the next one does its work.
                "options": {"expires": settings.sweep_interval_s},
            },
            "push-stripe-outbox": {
                "task": "fairmeter.push_stripe_outbox",
                "schedule": settings.stripe_push_interval_s,
                "options": {"expires": settings.stripe_push_interval_s},
            },
            "handle-stripe-webhooks": {
                "task": "fairmeter.handle_stripe_webhooks",
                "schedule": 5.0,
                "options": {"expires": 5.0},
            },
            "fan-out-webhooks": {
                "task": "fairmeter.fan_out_webhooks",
                "schedule": settings.webhooks_fanout_interval_s,
                "options": {"expires": settings.webhooks_fanout_interval_s},
            },
            "deliver-webhooks": {
                "task": "fairmeter.deliver_webhooks",
                "schedule": settings.webhooks_deliver_interval_s,
                "options": {"expires": settings.webhooks_deliver_interval_s},
            },
            "close-statements": {
                "task": "fairmeter.close_statements",
                "schedule": settings.statement_close_interval_s,
                "options": {"expires": settings.statement_close_interval_s},
            },
            "check-stripe-drift": {
                "task": "fairmeter.check_stripe_drift",
                "schedule": settings.stripe_drift_interval_s,
            },
            "ensure-partitions": {
                "task": "fairmeter.ensure_partitions",
                "schedule": settings.partitions_interval_s,
                "options": {"expires": settings.partitions_interval_s},
            },
            "archive-history": {
                "task": "fairmeter.archive_history",
                "schedule": settings.archive_interval_s,
                "options": {"expires": settings.archive_interval_s},
            },
        },
    )
    app.conf.update(broker_conf(settings))
    return app


@worker_init.connect
@beat_init.connect
def _refuse_a_weak_pepper(sender: Any = None, **_: Any) -> None:
    """A worker or beat with a published or short pepper stops before doing anything, with
    one line that says how to set it. (Only processes that serve refuse: importing this app
    to send a task, in a test or a script, stays possible.)"""
    try:
        require_strong_pepper(load_settings())
    except WeakPepperError as exc:
        kind = "beat" if isinstance(sender, beat.Service) else "worker"
        # The real stderr: beat has already redirected sys.stderr into its logger.
        print(f"fairmeter {kind}: {exc}", file=sys.__stderr__, flush=True)
        raise SystemExit(2) from None


@worker_process_init.connect
def _freeze_worker_heap(**_: Any) -> None:
    """Each pool process, once forked and initialised, freezes what it inherited."""
    freeze_startup_heap()


app = create_celery()
