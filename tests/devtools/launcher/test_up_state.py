"""A CLI command typed beside `make up` accepts the webhook URLs its API accepts (issue #31
item 5): `make up` lets webhooks reach receivers on this machine (plain http, loopback), but
`up.json` did not say so, and `fairmeter webhooks endpoints create --url
http://127.0.0.1:8080/` failed with `url_not_https` while the same request to the API passed.
An explicit `FAIRMETER_WEBHOOKS_ALLOW_PRIVATE=false` in the CLI's environment still wins."""

from __future__ import annotations

import os
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import main
from metering.config import load_cli_settings, write_up_state
from metering.errors import MeteringError
from tests.helpers.webhooks import customer

URL = "http://127.0.0.1:8080/"


@pytest.fixture
def beside_up(settings, tmp_path, monkeypatch):
    """This directory as a checkout with a live `make up` (this process) that allows private
    receivers, and a CLI environment that says nothing of them."""
    state = tmp_path / ".fairmeter"
    state.mkdir()
    served = settings.model_copy(update={"webhooks_allow_private": True})
    write_up_state(state, served, pid=os.getpid())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FAIRMETER_WEBHOOKS_ALLOW_PRIVATE", raising=False)
    load_cli_settings.cache_clear()
    yield
    load_cli_settings.cache_clear()


def create(tenant: str) -> Any:
    command = ["webhooks", "endpoints", "create", "--tenant", tenant, "--url", URL]
    return CliRunner().invoke(main, command)


def test_the_cli_beside_make_up_accepts_a_loopback_receiver(beside_up, engine, db):
    customer(engine, "demo", "c-1")
    result = create("demo")
    assert result.exit_code == 0, result.output
    rows = db.execute("SELECT url FROM webhook_endpoints WHERE tenant_id = 'demo'").fetchall()
    assert rows == [(URL,)]


def test_an_explicit_false_in_the_cli_s_environment_still_refuses_it(
    beside_up, engine, db, monkeypatch
):
    customer(engine, "demo", "c-1")
    monkeypatch.setenv("FAIRMETER_WEBHOOKS_ALLOW_PRIVATE", "false")
    load_cli_settings.cache_clear()
    result = create("demo")
    assert result.exit_code != 0
    # `fairmeter` (cli.main.run) prints a MeteringError as its code and fields
    assert isinstance(result.exception, MeteringError), result.output
    assert result.exception.code == "url_not_https" or any(
        error.code == "url_not_https" for error in result.exception.errors
    )
    assert db.execute("SELECT count(*) FROM webhook_endpoints").fetchone() == (0,)
