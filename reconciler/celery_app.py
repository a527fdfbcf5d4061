"""The Celery application: Redis broker, settings chosen for at-least-once, idempotent tasks.

Tasks re-check the database before acting, so acks-late redelivery is safe; results are
never stored (nothing reads them).
"""

from __future__ import annotations

import sys
from typing import Any

from celery import Celery, beat
from celery.signals import beat_init, worker_init, worker_process_init

from metering.config import Settings, WeakPepperError, load_settings, require_strong_pepper
from metering.heap import freeze_startup_heap

TASK_SOFT_TIME_LIMIT_S = 120
TASK_TIME_LIMIT_S = 150


def transport_options(settings: Settings) -> dict[str, int]:
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


def create_celery(settings: Settings | None = None) -> Celery:
    settings = settings or load_settings()
    app = Celery("fairmeter", broker=settings.redis_url, include=["reconciler.tasks"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_soft_time_limit=TASK_SOFT_TIME_LIMIT_S,
        task_time_limit=TASK_TIME_LIMIT_S,
        broker_transport_options=transport_options(settings),
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
        },
    )
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
