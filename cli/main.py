"""The ``fairmeter`` command: one group, each subcommand defined in a module of its own.

Every subcommand's module is imported only when that subcommand is called (or ``--help``
lists them all): a command's imports are the database driver, the ORM, the web server or
Parquet, and each ``fairmeter …`` process (the tests start hundreds) paid for all of them
when one would do. The development tools (``up``, ``simulate``, ``stripe-emulator``) live
in ``devtools/``, which the production image does not ship: a missing ``devtools`` is a
one-line error, not a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from metering.errors import MeteringError

# name -> (module, attribute) of the click command; the modules are imported on first use.
COMMANDS = {
    "archive": ("cli.archive", "archive"),
    "costs": ("cli.operations", "costs"),
    "db": ("cli.operations", "db"),
    "keys": ("cli.keys", "keys"),
    "policy": ("cli.policy", "policy"),
    "prices": ("cli.operations", "prices"),
    "report": ("cli.report", "report"),
    "serve": ("cli.operations", "serve"),
    "settle": ("cli.operations", "settle"),
    "statement": ("cli.statement", "statement"),
    "stripe": ("cli.billing", "stripe"),
    "support": ("cli.support", "support"),
    "webhooks": ("cli.webhooks", "webhooks"),
}

DEV_COMMANDS = {
    "up": ("devtools.launcher", "up"),
    "simulate": ("devtools.simulator.cli", "simulate"),
    "stripe-emulator": ("devtools.stripe_emulator.cli", "stripe_emulator"),
}


def _load(module_name: str, attribute: str) -> click.Command:
    command: click.Command = getattr(importlib.import_module(module_name), attribute)
    return command


class FairmeterGroup(click.Group):
    """A group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        available = importlib.util.find_spec("devtools") is not None
        return sorted([*COMMANDS, *(DEV_COMMANDS if available else ())])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            return _load(*COMMANDS[cmd_name])
        if cmd_name not in DEV_COMMANDS:
            return super().get_command(ctx, cmd_name)
        try:
            return _load(*DEV_COMMANDS[cmd_name])
        except ModuleNotFoundError as exc:
            raise click.ClickException(
                f"'fairmeter {cmd_name}' is a development tool and needs the dev environment "
                f"(run it from a checkout with `uv sync`); missing: {exc.name}"
            ) from None


@click.group(cls=FairmeterGroup)
def main() -> None:
    """Fairmeter: usage metering and billing protection for AI-agent runs."""


def run() -> None:
    try:
        main(standalone_mode=True)
    except MeteringError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    run()
