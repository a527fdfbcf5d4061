"""The ``fairmeter`` command: one group, each subcommand defined in a module of its own.

Production commands are imported here. The development tools (``up``, ``simulate``,
``stripe-emulator``) live in ``devtools/``, which the production image does not ship: they
are loaded only when called, and a missing ``devtools`` is a one-line error, not a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from cli.archive import archive
from cli.billing import stripe
from cli.keys import keys
from cli.operations import costs, db, prices, serve, settle
from cli.policy import policy
from cli.report import report
from cli.statement import statement
from cli.support import support
from cli.webhooks import webhooks
from metering.errors import MeteringError

DEV_COMMANDS = {
    "up": ("devtools.launcher", "up"),
    "simulate": ("devtools.simulator.cli", "simulate"),
    "stripe-emulator": ("devtools.stripe_emulator.cli", "stripe_emulator"),
}


class FairmeterGroup(click.Group):
    """A group whose development commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        available = importlib.util.find_spec("devtools") is not None
        return sorted([*super().list_commands(ctx), *(DEV_COMMANDS if available else ())])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in DEV_COMMANDS:
            return super().get_command(ctx, cmd_name)
        module_name, attribute = DEV_COMMANDS[cmd_name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise click.ClickException(
                f"'fairmeter {cmd_name}' is a development tool and needs the dev environment "
                f"(run it from a checkout with `uv sync`); missing: {exc.name}"
            ) from None
        command: click.Command = getattr(module, attribute)
        return command


@click.group(cls=FairmeterGroup)
def main() -> None:
    """Fairmeter: usage metering and billing protection for AI-agent runs."""


for command in (
    archive,
    keys,
    prices,
    costs,
    db,
    serve,
    settle,
    statement,
    support,
    stripe,
    webhooks,
    report,
    policy,
):
    main.add_command(command)


def run() -> None:
    try:
        main(standalone_mode=True)
    except MeteringError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    run()
