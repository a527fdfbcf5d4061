"""A what-if is replayed off the API process, at a lower priority, and under the same bounds
from the console as from the API (issue #30, docs/reliability.md "Ingest next to a tenant's
heavy requests"): replaying in the API process held its GIL and a core, and another
tenant's ingest there waited for both.

The API is served (one uvicorn process, two what-if workers at nice 7). A what-if is held in
its worker by a lock the test takes on ``decisions``, which only the replay reads (the
request's own process reads the policy versions and counts the runs, then waits), so
nothing depends on how fast the machine is. A worker's backend is named
``fairmeter-whatif-<what-if>-<OS pid>``: the test finds the worker's process by it.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from metering.config import Settings
from metering.settlement.replay_shards import WORKER_APPLICATION
from tests.api.heavy_harness import PATIENCE_S, PROMPT_S, Pending, abandoned, lock_waiters, locked
from tests.api.test_heavy_requests import JSON, LOCK_POLICIES, PERIOD, waiting, what_if
from tests.api.test_policy_whatif_console import PAGE, candidate
from tests.api.test_policy_whatif_console import post as post_form
from tests.helpers.processes import wait_until
from tests.security.harness import Served, serve
from tests.security.test_console_sessions import sign_in

LOCK_DECISIONS = "LOCK TABLE decisions IN ACCESS EXCLUSIVE MODE"
NICE = 7


@pytest.fixture(scope="module")
def api(settings: Settings, tmp_path_factory: Any) -> Iterator[Served]:
    with serve(
        settings,
        tmp_path_factory.mktemp("whatif-workers"),
        FAIRMETER_HEAVY_SLOTS_REDIS_PREFIX=f"fairmeter-test:slots:{uuid.uuid4().hex}",
        FAIRMETER_HEAVY_LOCK_TIMEOUT_S=str(PATIENCE_S),
        FAIRMETER_WHATIF_TIMEOUT_S=str(PATIENCE_S),
        FAIRMETER_WHATIF_PROCESSES="2",
        FAIRMETER_WHATIF_NICE=str(NICE),
    ) as served:
        yield served


def worker_pids(db: psycopg.Connection[Any]) -> list[int]:
    """The OS pids of the worker processes replaying a what-if in the test database now."""
    rows = db.execute(
        "SELECT application_name FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE %s",
        (f"{WORKER_APPLICATION}%",),
    ).fetchall()
    return [int(name.rsplit("-", 1)[1]) for (name,) in rows]


def parent_of(pid: int) -> int:
    # /proc/<pid>/stat: "pid (command) state ppid …"; the command may hold spaces.
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def console_what_if(base: str, token: str) -> httpx.Response:
    with httpx.Client(base_url=base, timeout=PROMPT_S) as browser:
        return post_form(browser, token, PAGE, **candidate(period="current"))


def test_a_what_if_is_replayed_by_a_worker_process_at_a_lower_priority(api, make_key, db, settings):
    key = make_key(tenant="acme", scope="admin")
    assert what_if(api.base, key).status_code == 200  # the workers have started
    with locked(settings, LOCK_DECISIONS):
        pending = Pending(what_if, api.base, key)
        assert wait_until(lambda: worker_pids(db), PROMPT_S), "no worker replays the what-if"
        (pid,) = worker_pids(db)
        assert api.process is not None
        assert pid != api.process.pid and parent_of(pid) == api.process.pid
        api_nice = os.getpriority(os.PRIO_PROCESS, api.process.pid)
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(api_nice + NICE, 19)
    assert pending.reply().status_code == 200


def test_a_what_if_whose_client_disconnects_leaves_no_worker_backend(api, make_key, db, settings):
    key = make_key(tenant="acme", scope="admin")
    assert what_if(api.base, key).status_code == 200  # the workers have started
    with locked(settings, LOCK_DECISIONS):
        with abandoned(api.base, "/v1/policy/what-if", key, json.dumps(PERIOD).encode(), JSON):
            assert wait_until(lambda: worker_pids(db), PROMPT_S), "no worker replays the what-if"
        gone = wait_until(lambda: not worker_pids(db), PROMPT_S)
        assert gone, "a worker's backend still replays for nobody"
        assert lock_waiters(db) == 0
    for _ in range(3):  # every worker serves the next what-ifs, the one cut off too
        assert what_if(api.base, key).status_code == 200


def test_a_tenants_second_console_what_if_is_refused_on_the_page_while_another_tenants_runs(
    api, make_key, db, settings
):
    acme_key = make_key(tenant="acme", scope="admin")
    with httpx.Client(base_url=api.base, timeout=PROMPT_S) as browser:
        acme = sign_in(browser, acme_key)
        globex = sign_in(browser, make_key(tenant="globex", scope="admin"))
    with locked(settings, LOCK_POLICIES):
        first = Pending(console_what_if, api.base, acme)
        assert waiting(db, 1), "the first what-if never reached the database"
        second = console_what_if(api.base, acme)
        assert second.status_code == 429, second.text
        assert "At most 1 what-if at a time per tenant" in second.text
        assert 'id="whatif-error"' in second.text and second.headers["retry-after"] == "1"
        assert what_if(api.base, acme_key).status_code == 429  # one slot, the API's too
        other_tenant = Pending(console_what_if, api.base, globex)
        assert waiting(db, 2), "another tenant's what-if was held back by acme's"
    for pending in (first, other_tenant):
        page = pending.reply()
        assert page.status_code == 200, page.text
        assert 'id="totals"' in page.text


def test_the_what_if_workers_end_with_their_api_process(make_key, db, settings, tmp_path):
    """uvicorn ends on a SIGTERM raised again after its graceful shutdown: no exit handler
    of the API process runs, so workers waiting for the next what-if must see it gone
    themselves (metering/worker_processes.py), or each stopped API leaves them for good."""
    key = make_key(tenant="acme", scope="admin")
    with serve(
        settings,
        tmp_path,
        FAIRMETER_HEAVY_SLOTS_REDIS_PREFIX=f"fairmeter-test:slots:{uuid.uuid4().hex}",
        FAIRMETER_WHATIF_PROCESSES="1",
    ) as served:
        with locked(settings, LOCK_DECISIONS):
            pending = Pending(what_if, served.base, key)
            assert wait_until(lambda: worker_pids(db), PROMPT_S), "no worker replays it"
            (worker,) = worker_pids(db)
        assert pending.reply().status_code == 200
        assert served.process is not None
        served.process.terminate()
        served.process.wait(PROMPT_S)
    assert wait_until(lambda: not Path(f"/proc/{worker}").exists() or zombie(worker), PROMPT_S), (
        "a what-if worker outlived its API process"
    )


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
