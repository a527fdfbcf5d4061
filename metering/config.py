"""One typed settings object, read once at the edge and passed down.

Nothing else in the code base reads ``os.environ``: the API factory, the Celery app and the
CLI each call :func:`load_settings` once and hand the result to the use cases.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_KEY_PEPPER = "dev-pepper-change-me"
# Peppers that are published (here and in docker-compose.yml), whatever their length.
PLACEHOLDER_KEY_PEPPERS = frozenset(
    {DEFAULT_KEY_PEPPER, "set-a-long-random-pepper", "change-me", "changeme"}
)
MIN_KEY_PEPPER_BYTES = 32


class Settings(BaseSettings):
    """Every tunable of Fairmeter. ``FAIRMETER_*`` variables, plus four standard names."""

    model_config = SettingsConfigDict(
        env_prefix="FAIRMETER_", extra="ignore", frozen=True, populate_by_name=True
    )

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        validation_alias=AliasChoices("DATABASE_URL", "FAIRMETER_DATABASE_URL"),
    )
    redis_url: str = Field(
        default=DEFAULT_REDIS_URL,
        validation_alias=AliasChoices("REDIS_URL", "FAIRMETER_REDIS_URL"),
    )
    # Celery's broker. None: the Redis above (the embedded default of `make up`). An
    # ``amqp://`` URL puts the tasks on RabbitMQ quorum queues (reconciler/broker.py); Redis
    # then still holds rate limits, kicks and the live-status fan-out.
    broker_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("CELERY_BROKER_URL", "FAIRMETER_BROKER_URL"),
    )
    stripe_api_key: str | None = Field(
        default=None,
        validation_alias=AliasChoices("STRIPE_API_KEY", "FAIRMETER_STRIPE_API_KEY"),
    )

    # Stripe (docs/stripe.md). Without an API base the official API is used; `make up` and the
    # tests point it at the bundled emulator.
    stripe_api_base: str | None = None
    stripe_meter_event_name: str = "fairmeter_billed_micros"
    stripe_meter_unit_micros: int = 1
    stripe_allow_negative_meter_values: bool = False
    stripe_max_network_retries: int = 2
    stripe_timeout_s: float = 10.0
    stripe_webhook_secret: str | None = None
    stripe_webhook_tolerance_s: int = 300
    # Stripe cancels meter events only within 24 h of receiving them; keep a safety margin.
    stripe_cancel_window_s: int = 24 * 3600 - 600
    stripe_push_batch_size: int = 2000
    stripe_push_threads: int = 8
    # A pusher renews its claim on its customers' rows every third of this while its round
    # lasts, so a killed pusher's customers are claimed again within it (issue #13 §7).
    stripe_push_lease_s: int = 15
    stripe_backoff_base_s: float = 2.0
    stripe_backoff_max_s: float = 300.0
    stripe_push_interval_s: float = 2.0
    # Retries of one call inside a push round before the row waits for next_attempt_at.
    stripe_quick_retries: int = 2
    stripe_drift_interval_s: float = 3600.0
    # The API version every request sends (Stripe-Version), pinned here and nowhere else: the
    # SDK's own version, so typed responses match; configure the event destinations with it.
    stripe_api_version: str = "2026-10-28.endive"
    # Thin events (v2, e.g. v1.billing.meter.error_report_triggered) come from their own
    # event destination with its own signing secret, to POST /webhooks/stripe/thin.
    stripe_thin_webhook_secret: str | None = None
    # A period stays open until its invoice is finalized: Stripe's default finalization
    # grace is one hour after the period ends; a period counts as closed this margin before.
    stripe_finalization_grace_s: int = 3600
    stripe_period_close_margin_s: int = 600
    # Stripe keeps an idempotency key (and a meter event identifier) for at least 24 h; a row
    # still retrying this long (less the margin) after its first call sends nothing more: it
    # waits for Stripe's summaries (below) before anything is resent under new keys.
    stripe_idempotency_window_s: int = 24 * 3600
    stripe_idempotency_margin_s: int = 3600
    # Meter event summaries are eventually consistent with no documented bound on their lag:
    # they are read as "did not land" only this long after the last call that could have
    # landed, a window far longer than any lag seen (docs/stripe.md "Exactly once").
    stripe_summary_trust_s: float = 6 * 3600.0
    # The drift check's patience only (drift.summary_lag): hours that ended less than this
    # ago are not compared, so a usual lag raises no false alarm. Never proof that a call
    # did not land: that takes stripe_summary_trust_s.
    stripe_summary_lag_s: float = 3600.0
    # Client-side rate limits, per process, at Stripe's documented rates: 100 operations/s
    # in live mode (25 in a sandbox: set it so), and 1000 meter events/s.
    stripe_rate_limit_per_s: float = 100.0
    stripe_meter_event_rate_limit_per_s: float = 1000.0
    # A credit note's part above what the invoice still owes (it was paid): "refund" to the
    # payment method, or "credit" to the customer's balance in the invoice's currency.
    stripe_credit_note_after_payment: Literal["refund", "credit"] = "refund"

    # Secrets. The pepper turns a stolen key table into useless HMACs. Served processes
    # refuse to start with the default, a placeholder or a short one (pepper_weakness).
    key_pepper: str = DEFAULT_KEY_PEPPER
    # How long a process trusts a key lookup (found or not).
    key_cache_ttl_s: float = 30.0
    # Key ids each API process remembers (found and unknown ones apart, least recently used
    # evicted first), so a flood of forged ids cannot push the real keys out.
    key_cache_max_ids: int = 10_000

    # Ingest limits (docs/events.md).
    max_batch_events: int = 1000
    max_body_bytes: int = 1024 * 1024
    max_future_skew_s: int = 300
    max_event_age_s: int = 35 * 24 * 3600
    max_json_depth: int = 32
    # Group commit (api/ingest_group.py): requests of up to `ingest_group_request_events`
    # events that arrive while an earlier group commits are stored together, up to
    # `ingest_group_max_events` per transaction, `ingest_group_flushes` transactions in
    # flight per API process. Larger requests amortise their own transaction and are
    # stored alone, in parallel, so a big batch never holds up single events. Off: one
    # transaction per request.
    ingest_group_commit: bool = True
    ingest_group_request_events: int = 50
    ingest_group_max_events: int = 1000
    ingest_group_flushes: int = 1

    # Settlement windows (docs/policy.md).
    settle_grace_s: int = 120
    resume_window_s: int = 900
    idle_timeout_s: int = 3600

    # The sweeper (docs/policy.md): it claims due runs with a lease, hands them to
    # workers in chunks, and parks a run that fails this many times in a row.
    sweep_interval_s: float = 1.0
    sweep_batch_size: int = 5000
    settle_chunk_size: int = 200
    # A claimed chunk waits in the broker's queue for a worker this long at most before the
    # sweep claims its runs again; nobody can renew it there, so it is long. A worker that
    # starts the chunk holds the runs on the short `settle_hold_lease_s` instead, renewed
    # every third of it while it works: a killed worker's runs are claimed again within it.
    claim_lease_s: int = 120
    settle_hold_lease_s: int = 15
    max_settle_attempts: int = 5
    # Redis redelivers a task not acknowledged within this many seconds (Celery's
    # ``visibility_timeout``). None: four times the hard task time limit, so a running task
    # is never delivered twice. Lower only to test that duplicate deliveries are harmless.
    # RabbitMQ has no such timeout: it redelivers only when the consumer's connection or
    # channel goes away, so this setting is ignored there.
    broker_visibility_timeout_s: int | None = None
    # RabbitMQ only: a task message delivered this many times without being acknowledged (its
    # worker process died each time, or its connection dropped) is a poison message; the
    # quorum queue moves it to the dead-letter queue instead of feeding it to workers forever.
    broker_delivery_limit: int = Field(default=5, ge=1)

    # What-if replays (metering/settlement/replay_shards.py): a large period is replayed on
    # this many processes, all reading one snapshot. 0: one per CPU. An API request's
    # replay always runs in these worker processes, never in the API process (whose other
    # requests would wait for its GIL); the command line replays a small period itself.
    whatif_processes: int = Field(default=0, ge=0, le=64)
    # A period of at least this many runs is replayed on all of them (below, the workers'
    # share and the merge cost more than they save).
    whatif_parallel_from_runs: int = Field(default=20_000, ge=1)
    # The workers are shared by every tenant of an API process: an API request's period is
    # replayed in shards of at most about this many runs, handed out one per free worker to
    # the tenant with the fewest running, so another tenant's what-if waits for a worker at
    # most one such shard (issue #30; docs/reliability.md). Smaller: a shorter wait, more
    # shards (each reads the period's index and checks its first 1,000 runs).
    whatif_shard_runs: int = Field(default=10_000, ge=1)
    # How much the what-if workers of an API process lower their priority (``os.nice``) when
    # they start: the OS then gives the API processes the CPU first and a replay what is
    # left, so another tenant's ingest does not wait for it (issue #30). 0 keeps it equal.
    whatif_nice: int = Field(default=10, ge=0, le=19)

    # Heavy requests (what-ifs, OTLP exports), bounded per tenant so that one tenant's heavy
    # work uses only its share (docs/reliability.md, "Ingest next to a tenant's heavy
    # requests"). Concurrent ones per tenant, across every API process (a Redis semaphore
    # that fails open); one more is a 429 with Retry-After.
    whatif_concurrent_per_tenant: int = Field(default=1, ge=1)
    otlp_concurrent_exports_per_tenant: int = Field(default=2, ge=1)
    heavy_slots_redis_prefix: str = "fairmeter:slots"
    # Spans in one OTLP export; more is a 413. The SDKs' BatchSpanProcessor exports at most
    # 512 per request by default (OTEL_BSP_MAX_EXPORT_BATCH_SIZE), so that fits four times.
    otlp_max_spans_per_request: int = Field(default=2048, ge=1)
    # How long a heavy request may run in PostgreSQL: no longer than its client waits (an
    # OTLP exporter gives up after 10 s by default, OTEL_EXPORTER_OTLP_TIMEOUT). Past it the
    # query is cancelled and the reply is a retryable 503. A lock is waited for at most
    # ``heavy_lock_timeout_s`` (two exports to one run take its row lock in turn).
    whatif_timeout_s: float = Field(default=60.0, gt=0)
    otlp_export_timeout_s: float = Field(default=10.0, gt=0)
    heavy_lock_timeout_s: float = Field(default=5.0, gt=0)
    # An OTLP export of more spans than ``ingest_group_request_events`` is decoded, mapped,
    # validated, priced and stored (~0.5 s of Python for 2,048 spans) by worker processes of
    # its API process (api/cpu_pool.py), so it does not hold up the process's other
    # requests: ``otlp_cpu_processes`` of them (0: one per CPU, and at least one more than
    # ``otlp_concurrent_exports_per_tenant``, so one tenant's exports never hold every worker
    # of a process), each started ``heavy_cpu_nice`` steps below the API process's CPU
    # priority (``nice``), so the API processes get the CPU first.
    otlp_cpu_processes: int = Field(default=0, ge=0, le=64)
    heavy_cpu_nice: int = Field(default=10, ge=0, le=19)

    # Policy versions (docs/policies.md): a version's ``effective_from`` is at most this far
    # ahead, so a mistyped year (9999, 2062 for 2026) is refused instead of scheduling a
    # version every later one must follow. Writers of one tenant's policy queue on its lock
    # at most ``policy_write_wait_s``, then get a retryable 409 ``policy_write_conflict``.
    policy_max_lead_s: int = Field(default=366 * 24 * 3600, ge=0)
    policy_write_wait_s: float = Field(default=5.0, gt=0)

    # Protection cap (R8), per customer per calendar month (UTC).
    cap_fraction_ppm: int = 250_000
    cap_floor_micros: int = 5_000_000
    cap_runs: int = 20
    # A month's statement closes this long after the month ends (late settlements of runs
    # that ended just before midnight still land in it); later changes go to the next one.
    period_close_delay_s: int = 24 * 3600
    # Beat looks for closed statements to announce (``statement.closed``) this often, over
    # this many of the latest closed months (a statement held back by a run still waiting
    # for its decision is announced once that run settles, if it is still among them).
    statement_close_interval_s: float = 300.0
    statement_close_lookback_periods: int = 3
    # Monthly partitions of the append-only tables (issue #18, metering/history): made this
    # many months ahead, checked this often (each check creates only what is missing).
    partitions_ahead_months: int = Field(default=3, ge=1, le=24)
    partitions_interval_s: float = 3600.0
    # Retention (issue #18, metering/history/archive.py): a month of raw events leaves the
    # database once the whole month ended this many months ago, every other monthly table
    # (ledger, decisions, usage lines, Stripe deliveries, audit log) after the second, seven
    # years. It goes to Parquet files under ``archive_url`` (a directory or any fsspec URL:
    # ``file:///…``, ``s3://bucket/prefix``); None: nothing is archived, and each run warns
    # how many months wait. The beat runs the archive every ``archive_interval_s``.
    events_retention_months: int = Field(default=13, ge=1)
    history_retention_months: int = Field(default=84, ge=1)
    archive_url: str | None = None
    archive_interval_s: float = 86400.0
    # Detaching and dropping a partition needs the tables' owner (the role the migrations
    # ran as), which the application role is not (docs/deploy/init-app-role.sql): the archive
    # connects here. None: database_url (enough where the application is the owner, as in
    # `make up`; elsewhere months are written and verified but reported failed, not dropped).
    archive_database_url: str | None = None
    # A month brought back with `fairmeter archive restore` stays this long for its audit
    # before a run takes it out again (after checking it still equals its file).
    archive_restore_keep_days: int = Field(default=30, ge=0)
    # How long a statement link support sends a customer opens the statement (issue #15).
    statement_link_ttl_s: int = 7 * 24 * 3600

    # Support credits (issue #13): what support keys may give back without an admin. Both
    # limits are cumulative and count every credit already granted, by any key: a credit
    # that would take a run's support credits, or a customer's support credits granted that
    # UTC day, above the limit needs an admin key.
    support_credit_limit_micros: int = 50_000_000  # per run, all its credits together
    # Per customer per UTC day, across its runs: four runs credited up to the per-run limit.
    # Generous for a day of goodwill on one account, yet it bounds what a mistaken or stolen
    # support key can hand one customer before an admin has to look.
    support_credit_customer_daily_limit_micros: int = 200_000_000

    # Rate limits (issue #8): requests per window per API key, chosen by the key's scope, and
    # per client address for requests without a valid key. Counted in Redis, so all API
    # processes share them; the defaults stop floods, not busy clients.
    rate_limit_enabled: bool = True
    rate_limit_window_s: float = 1.0
    rate_limit_ingest_requests: int = 5000
    rate_limit_customer_requests: int = 2000
    rate_limit_support_requests: int = 2000
    rate_limit_admin_requests: int = 2000
    rate_limit_anonymous_requests: int = 2000
    # Events per window per ingest key, whatever the batching: a 1,000-event batch spends
    # 1,000 of these (and one request). A batch that does not fit is refused whole, so keep
    # this at least max_batch_events.
    rate_limit_ingest_events: int = 100_000
    # Events per window per tenant, all its keys and both protocols together: a tenant's
    # share of the deployment's ingest. Issuing more keys does not raise it. Size it to a
    # share of what the deployment stores (docs/reliability.md, "Ingest next to a tenant's
    # heavy requests"); at least max_batch_events and otlp_max_spans_per_request.
    rate_limit_tenant_events: int = Field(default=20_000, ge=1)
    rate_limit_redis_prefix: str = "fairmeter:ratelimit"
    # How long a key id found in the database is remembered in Redis as real, so that it
    # skips the client address's anonymous budget at every API process (each lookup that
    # finds it again renews it). Longer than the key cache on purpose: a tenant whose key was
    # idle for a while must not be refused at a process its first request reaches because
    # a forged flood from its address (a NAT, a proxy) spent that budget. It costs no
    # database reads: each process looks a remembered id up at most once per key cache TTL,
    # and an id that turns out revoked or forged is still paid for by the address.
    rate_limit_found_key_ttl_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    # After a Redis error the limiter lets requests through this long before asking again.
    rate_limit_redis_retry_s: float = 5.0
    # Peers whose X-Forwarded-For is believed (comma-separated IPs or CIDRs). Empty: nobody's,
    # so the limiter counts the address that actually connected. Required behind a proxy,
    # else all its clients share one address's budget (the API warns once when it sees one).
    trusted_proxies: str = ""
    # How long a served API worker may take to start before its supervisor gives up on it.
    # uvicorn's own default (5 s) kills and restarts a worker still importing the app on a
    # loaded host, forever: on a 2-core machine at load 13 no worker ever came up.
    worker_start_timeout_s: int = 120
    # On SIGTERM uvicorn waits for open responses to finish; a live status stream never
    # does, so after this long the API cuts what is still open (stream clients reconnect
    # with Last-Event-ID to another process and lose nothing) and stops.
    shutdown_grace_s: int = 10

    # Live status streams (GET /v1/runs/{run}/stream, /v1/customers/{c}/stream, issue #16).
    # A comment line this often keeps proxies and load balancers from closing an idle one.
    stream_heartbeat_s: float = 15.0
    # A stream ends after this long and the client resumes with Last-Event-ID (EventSource
    # does so by itself): long-lived connections spread over new API processes, and a
    # revoked key's stream stops within this time.
    stream_max_s: float = 300.0
    # Open streams per API process; one more is a 503 problem (each holds a socket, an inbox
    # and a share of the event loop). A tenant's share of them: one more is a 429, whatever
    # the process's state, so one tenant (however many customer keys it holds) never fills a
    # process. A fifth: five tenants at their full share before a process refuses anyone, and
    # 200 still covers a tenant with 100 people each following two runs on one process. The
    # share is per process, not counted across processes: each slot is a process's, and a
    # process that restarts must not leave counts behind (docs/events.md, Live status
    # streams). One key holds at most its own share, beneath the tenant's (one more is a
    # 429), so one end customer's key cannot take its tenant's whole share.
    stream_max_per_process: int = 1000
    stream_max_per_tenant: int = 200
    stream_max_per_key: int = 100
    # Notifications waiting for one slow client; beyond this they are dropped from memory
    # and the stream catches up from the notifications table instead.
    stream_queue_items: int = 256
    # The reconnection delay the stream suggests to clients (SSE ``retry:``).
    stream_retry_ms: int = 2000
    # The process's LISTEN connection: how long to wait before reconnecting after it was
    # lost (doubling up to 30 s), and how often to check an idle one is still alive.
    stream_listener_retry_s: float = 0.5
    stream_listener_check_s: float = 10.0

    # Outbound webhooks (issue #16, docs/webhooks.md). Targets on loopback, private,
    # link-local, multicast or reserved addresses and plain http are refused unless allowed
    # (the tests and `make up`'s demo receive on loopback).
    webhooks_allow_private: bool = False
    # One attempt's limit: connect, send and read the answer each within it.
    webhooks_timeout_s: float = 15.0
    # The waits after each failed attempt (jittered by up to a fifth either way): eight
    # attempts over about 28 hours, then the message is failed, visibly.
    webhooks_retry_schedule_s: list[float] = Field(
        default_factory=lambda: [5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0]
    )
    # An endpoint whose every attempt failed for this long is disabled, with the reason.
    webhooks_disable_after_s: float = 3 * 24 * 3600
    # After a rotation the old secret signs beside the new one this long.
    webhooks_secret_overlap_s: float = 24 * 3600
    # A sender renews its lease on the messages it holds every third of this, so a killed
    # worker's messages are sent again within it.
    webhooks_lease_s: float = 30.0
    webhooks_fanout_interval_s: float = 1.0
    webhooks_deliver_interval_s: float = 1.0
    webhooks_fanout_batch: int = 500
    webhooks_delivery_batch: int = 64
    # Sends at once in a delivery round, and at most this many to any one endpoint: a slow
    # or hanging receiver holds its own share and no more, so it cannot hold up another
    # tenant's webhooks. An endpoint holds at most eight times its share of claimed messages
    # (claimed ahead, waiting for a send slot) across rounds.
    webhooks_delivery_threads: int = 16
    webhooks_endpoint_concurrency: int = 8
    # A delivery task keeps claiming what became due (a run's next message once the one
    # before it is delivered) for this long; then it lets go of what it has not started,
    # sends only what can go at once while its running sends finish, and leaves the rest
    # to the next one.
    webhooks_round_s: float = 10.0
    # Delivery rounds at once across all workers (each sends ``webhooks_delivery_threads``
    # at a time); more rounds than this leave at once, so the rest of a worker's processes
    # stay free for settlement and fan-out. Raise it with the number of worker hosts.
    webhooks_delivery_rounds: int = 1
    # An endpoint failing in a row (timeouts, refused connections, 5xx) gets one probing
    # send at a time, then none for a pause doubling from the first to the second figure
    # (metering/webhooks/breaker.py); one answered attempt ends it. The cap is the first
    # retry wait; retries due together at a failing endpoint go one probe after another.
    webhooks_breaker_pause_s: float = 1.0
    webhooks_breaker_max_pause_s: float = 5.0
    # A notification id the fan-out passed over (its transaction had not committed yet) is
    # looked for again until this long after: longer than any transaction that records one
    # may stay open (the tasks' hard limit is 150 s).
    webhooks_fanout_horizon_s: float = 600.0

    # Database pool.
    # Sized so 32 concurrent requests per process reuse connections instead of opening and
    # closing overflow ones (bench/ingest.py measured +40 % single-event throughput).
    db_pool_size: int = 16
    db_max_overflow: int = 8

    log_level: str = "INFO"
    log_json: bool = True

    @property
    def stripe_enabled(self) -> bool:
        """Stripe sync runs against the real API (a key) or an emulator (an API base)."""
        return bool(self.stripe_api_key or self.stripe_api_base)

    @property
    def task_broker_url(self) -> str:
        """Where Celery's tasks travel: the broker URL if one is set, else Redis."""
        return self.broker_url or self.redis_url

    def sqlalchemy_url(self) -> str:
        """The database URL with the psycopg 3 driver, whatever scheme the user gave."""
        return to_psycopg_url(self.database_url)

    def libpq_url(self) -> str:
        """The database URL as psycopg.connect takes it (for processes with no engine)."""
        return "postgresql://" + self.sqlalchemy_url().removeprefix("postgresql+psycopg://")


def to_psycopg_url(url: str) -> str:
    """Normalise ``postgres://`` / ``postgresql://`` URLs to SQLAlchemy's psycopg 3 dialect."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


class WeakPepperError(ValueError):
    """The key pepper must not protect a served deployment; the message says how to fix it."""


def pepper_weakness(pepper: str) -> str | None:
    """Why ``pepper`` is unfit for a served API, worker or beat, or ``None`` when it is fit.

    Whoever knows the pepper can turn a leaked key table into working keys, so a published
    one (the code default, the compose placeholder) is as bad as none, and a short one can
    be guessed offline from any one key and its stored HMAC.
    """
    if pepper in PLACEHOLDER_KEY_PEPPERS:
        return "is a published placeholder"
    if len(pepper.encode()) < MIN_KEY_PEPPER_BYTES:
        return f"is shorter than {MIN_KEY_PEPPER_BYTES} bytes"
    return None


def require_strong_pepper(settings: Settings) -> None:
    """Raise :class:`WeakPepperError` (one line: what is wrong and how to set it)."""
    weakness = pepper_weakness(settings.key_pepper)
    if weakness is not None:
        raise WeakPepperError(
            f"refusing to start: FAIRMETER_KEY_PEPPER {weakness}; set it to a random secret "
            f"of at least {MIN_KEY_PEPPER_BYTES} bytes, e.g. FAIRMETER_KEY_PEPPER="
            "$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))'), "
            "and keep it: keys made under one pepper do not work under another"
        )


@lru_cache(maxsize=1)
def load_settings() -> Settings:
    """Read the environment once per process."""
    return Settings()


# --- a running `fairmeter up` ---------------------------------------------------------------

DEFAULT_STATE_DIR = Path(".fairmeter")
UP_STATE_FILE = "up.json"
# What `fairmeter up` resolved and its children were given; a CLI command run beside it needs
# the same to reach that instance (the pepper too: a key created under another is useless).
UP_STATE_FIELDS = (
    "database_url",
    "redis_url",
    "key_pepper",
    "stripe_api_base",
    "stripe_webhook_secret",
    "stripe_thin_webhook_secret",
    # `fairmeter up` lets its webhooks reach loopback receivers; the CLI beside it must accept
    # the same URLs the API does (issue #31 item 5: `url_not_https` for a local receiver)
    "webhooks_allow_private",
)


def write_up_state(state_dir: Path, settings: Settings, *, pid: int) -> Path:
    """Record, for CLI commands run from the same checkout, where ``fairmeter up`` serves.

    Owner-only (it holds the pepper); replaced atomically so a reader never sees half of it.
    """
    path = state_dir / UP_STATE_FILE
    values = {name: getattr(settings, name) for name in UP_STATE_FIELDS}
    partial = path.with_suffix(".tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"pid": pid, "settings": values}, handle)
    partial.replace(path)
    return path


def remove_up_state(state_dir: Path) -> None:
    (state_dir / UP_STATE_FILE).unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    if pid <= 0:  # 0 and -1 would signal whole groups
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, but alive
    return True


def running_up_values(state_dir: Path) -> dict[str, str | bool]:
    """The settings a live ``fairmeter up`` recorded in ``state_dir``; empty when none runs.

    A file left by a launcher that was killed names servers that are gone: ignored.
    """
    try:
        recorded = json.loads((state_dir / UP_STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(recorded, dict) or not _process_alive(int(recorded.get("pid", 0))):
        return {}
    values = recorded.get("settings", {})
    return {k: v for k, v in values.items() if k in UP_STATE_FIELDS and isinstance(v, str | bool)}


@lru_cache(maxsize=1)
def load_cli_settings(state_dir: Path = DEFAULT_STATE_DIR) -> Settings:
    """The CLI's settings: the environment's, and for what it leaves unset, those of the
    ``fairmeter up`` running from this directory, so the README's commands typed in a second
    terminal reach the embedded database, Redis and Stripe emulator with nothing to export."""
    settings = Settings()
    # set in the environment: a value, or a switch set either way
    given = {
        name
        for name in settings.model_fields_set
        if getattr(settings, name) or isinstance(getattr(settings, name), bool)
    }
    if "stripe_api_key" in given:  # the real Stripe: never mix in the emulator's address
        given |= {"stripe_api_base", "stripe_webhook_secret"}
    fill = {k: v for k, v in running_up_values(state_dir).items() if k not in given}
    return settings.model_copy(update=fill) if fill else settings
