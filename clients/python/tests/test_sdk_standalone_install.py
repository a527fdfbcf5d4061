"""The SDK installs alone: `pip install ./clients/python` in a bare virtualenv gives a
working client, with no server dependency pulled in."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
import venv
from pathlib import Path

SDK_ROOT = Path(__file__).resolve().parents[1]
SERVER_PACKAGES = ("litestar", "sqlalchemy", "sqlmodel", "celery", "psycopg", "stripe", "metering")

SNIPPET = """
import importlib.metadata, importlib.util, json, sys, tempfile, os
import fairmeter_client
from fairmeter_client import Meter, StatusEvent, follow_run
spool = os.path.join(tempfile.mkdtemp(), "spool.db")
meter = Meter("http://127.0.0.1:9", "key", source="agent/x", spool_path=spool, start=False)
with meter.run("run-1", customer="cust-1") as run:
    run.started()
    run.usage(step=1, model="agent-large-1", input_tokens=10, output_tokens=1)
dist = importlib.metadata.distribution("fairmeter-client")
print(json.dumps({
    "pending": meter.stats().pending_events,
    "installed": sorted(p for p in %r if importlib.util.find_spec(p) is not None),
    "requires": dist.requires or [],
    "requires_python": dist.metadata["Requires-Python"],
    "top_level": sorted({f.parts[0] for f in dist.files or []}),
    "module": fairmeter_client.__file__,
    "prefix": sys.prefix,
}))
"""


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()


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
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["installed"] == []
    assert found["pending"] == 2
    declared = tomllib.loads((SDK_ROOT / "pyproject.toml").read_text())["project"]
    # The client that ran is the installed copy, not the checkout's by path...
    assert Path(found["module"]).is_relative_to(found["prefix"])
    # ...from a wheel of the SDK package alone (no tests, nothing of the server)...
    dist_info = f"fairmeter_client-{declared['version']}.dist-info"
    assert found["top_level"] == ["fairmeter_client", dist_info]
    # ...whose metadata asks for what its pyproject declares (httpx, and standardwebhooks for
    # verifying webhooks) and nothing of the server, on the Python the project declares.
    wanted = sorted(requirement_name(r) for r in declared["dependencies"])
    assert wanted == ["httpx", "standardwebhooks"]
    assert sorted(requirement_name(r) for r in found["requires"]) == wanted
    assert found["requires_python"] == declared["requires-python"]
