"""The SDK installs alone: `pip install ./clients/python` in a bare virtualenv gives a
working client, with no server dependency pulled in."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

SDK_ROOT = Path(__file__).resolve().parents[1]
SERVER_PACKAGES = ("litestar", "sqlalchemy", "sqlmodel", "celery", "psycopg", "stripe", "metering")

SNIPPET = """
import importlib.util, json, sys, tempfile, os
from fairmeter_client import Meter, follow_run, StatusEvent
spool = os.path.join(tempfile.mkdtemp(), "spool.db")
meter = Meter("http://127.0.0.1:9", "key", source="agent/x", spool_path=spool, start=False)
with meter.run("run-1", customer="cust-1") as run:
    run.started()
    run.usage(step=1, model="agent-large-1", input_tokens=10, output_tokens=1)
print(json.dumps({
    "pending": meter.stats().pending_events,
    "installed": sorted(p for p in %r if importlib.util.find_spec(p) is not None),
}))
"""


def test_the_sdk_installs_and_works_in_a_bare_virtualenv(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", str(SDK_ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    out = subprocess.run(
        [python, "-c", SNIPPET % (SERVER_PACKAGES,)],
        cwd=tmp_path,  # not the repository: nothing of the server is importable by path
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert '"installed": []' in out.stdout
    assert '"pending": 2' in out.stdout
    assert sys.version_info >= (3, 11)
