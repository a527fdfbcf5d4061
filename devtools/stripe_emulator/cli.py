"""``fairmeter stripe-emulator``: run the Stripe emulator until Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from types import FrameType

import click

from devtools.stripe_emulator import destinations
from devtools.stripe_emulator.server import EmulatorServer


@click.command("stripe-emulator")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=12111, type=int, show_default=True)
@click.option("--webhook-url", default=None, help="Where POST /_emulator/webhooks delivers.")
@click.option("--webhook-secret", default=None, help="The endpoint's signing secret (whsec_...).")
@click.option(
    "--destination",
    "destination_specs",
    multiple=True,
    metavar="STYLE SECRET URL",
    type=(click.Choice(["snapshot", "thin"]), str, str),
    help="An event destination for generated events (repeatable).",
)
@click.option(
    "--state-file",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Keep meters, customers and meter events here across restarts (default: forget).",
)
def stripe_emulator(
    host: str,
    port: int,
    webhook_url: str | None,
    webhook_secret: str | None,
    destination_specs: tuple[tuple[str, str, str], ...],
    state_file: Path | None,
) -> None:
    """Serve an in-memory Stripe (meters, meter events, customers, invoices, credit notes,
    webhooks) for local runs."""
    try:
        server = EmulatorServer(host, port)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from exc
    server.state.settings.update({"webhook_url": webhook_url, "webhook_secret": webhook_secret})
    for style, secret, url in destination_specs:
        destinations.add_destination(server.state, {"style": style, "secret": secret, "url": url})

    def _stop(signum: int, frame: FrameType | None) -> None:
        server.request_stop()

    signal.signal(signal.SIGTERM, _stop)
    keeper = None
    if state_file is not None:
        from devtools.stripe_emulator import persistence

        restored = persistence.load(server.state, state_file)
        click.echo(f"restored {restored} customer(s) from {state_file}")
        keeper = persistence.Keeper(server.state, state_file)
    click.echo(server.url, nl=True)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    finally:
        if keeper is not None:
            keeper.close()


if __name__ == "__main__":
    stripe_emulator()
