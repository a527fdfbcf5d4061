"""Issue #18: which broker Celery uses, and what it asks of RabbitMQ.

The reliability tests (tests/reliability/test_rabbitmq.py) show the behaviour on a real
broker; these pin the choice itself: Redis unless a broker URL is set, and on ``amqp://``
quorum queues with a delivery limit, a dead letter and publisher confirms.
"""

from __future__ import annotations

import pytest

from metering.config import Settings
from reconciler.broker import DEAD_LETTER_EXCHANGE, DEAD_LETTER_QUEUE, TASK_QUEUE, broker_conf
from reconciler.celery_app import create_celery

AMQP = "amqp://guest:guest@127.0.0.1:5672/fairmeter"


def settings_from(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for name in ("CELERY_BROKER_URL", "FAIRMETER_BROKER_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def test_the_broker_defaults_to_redis_with_its_visibility_timeout(monkeypatch):
    settings = settings_from(monkeypatch, REDIS_URL="redis://127.0.0.1:6379/3")
    app = create_celery(settings)
    assert app.conf.broker_url == "redis://127.0.0.1:6379/3"
    assert app.conf.broker_transport_options == {"visibility_timeout": 600}
    assert app.conf.task_default_queue_type == "classic"


@pytest.mark.parametrize("variable", ["CELERY_BROKER_URL", "FAIRMETER_BROKER_URL"])
def test_an_amqp_broker_url_puts_tasks_on_a_quorum_queue_with_a_dead_letter(monkeypatch, variable):
    settings = settings_from(
        monkeypatch, **{variable: AMQP, "FAIRMETER_BROKER_DELIVERY_LIMIT": "7"}
    )
    app = create_celery(settings)
    assert app.conf.broker_url == AMQP
    assert app.conf.broker_transport_options == {"confirm_publish": True}
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost
    assert app.conf.worker_detect_quorum_queues and app.conf.worker_prefetch_multiplier == 1
    (queue,) = app.amqp.queues.values()
    assert queue.name == TASK_QUEUE and queue.durable
    assert queue.queue_arguments == {
        "x-queue-type": "quorum",
        "x-delivery-limit": 7,
        "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE,
        "x-dead-letter-routing-key": DEAD_LETTER_QUEUE,
    }
    # Native delayed delivery (countdown/ETA on quorum queues) needs a topic exchange.
    assert queue.exchange.type == "topic"


def test_a_delivery_limit_below_one_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="broker_delivery_limit"):
        settings_from(monkeypatch, FAIRMETER_BROKER_DELIVERY_LIMIT="0")


def test_the_visibility_timeout_is_a_redis_setting_only(monkeypatch):
    settings = settings_from(
        monkeypatch, CELERY_BROKER_URL=AMQP, FAIRMETER_BROKER_VISIBILITY_TIMEOUT_S="2"
    )
    assert "visibility_timeout" not in broker_conf(settings)["broker_transport_options"]
