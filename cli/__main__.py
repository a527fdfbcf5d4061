"""``python -m cli …`` is ``fairmeter …``."""

from cli.main import run

run()
