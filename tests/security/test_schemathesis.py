"""Schemathesis against the served OpenAPI document, once per key scope, with every check on.

The API runs as deployed (``fairmeter serve``) with the webhook secret set, on a database that
holds settled, held and refunded runs and an open dispute, so that reads return real data for
the response schemas to be checked against. The number of examples per operation is bounded so
that the four runs take well under two minutes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events, from_schema

from metering.config import Settings
from tests.security.harness import Served, seed_tenant, serve

pytestmark = pytest.mark.timeout(180)

MAX_EXAMPLES = 12
SEED = 20_251_130


def config(key: str) -> SchemathesisConfig:
    return SchemathesisConfig.from_dict(
        {
            "headers": {"Authorization": f"Bearer {key}"},
            "seed": SEED,
            "generation": {"max-examples": MAX_EXAMPLES},
            "checks": {
                # Every check is on; these two only get the statuses this API may rightly give.
                # A schema cannot say which models are in the price catalog, how old an event
                # may be, or that a credit names exactly one of full / amount / percent: such
                # schema-valid requests are refused with 422 (or 409 for a conflict).
                # Nor that PostgreSQL cannot store a NUL character or a lone surrogate in a
                # text: such strings are refused with 400 invalid_value (README, Security).
                "positive_data_acceptance": {
                    "expected-statuses": ["2xx", "400", "401", "403", "404", "409", "422", "429"]
                },
                # A batch over the documented maximum of 1,000 events is refused with 413.
                "negative_data_rejection": {
                    "expected-statuses": [
                        "400",
                        "401",
                        "403",
                        "404",
                        "405",
                        "406",
                        "409",
                        "413",
                        "415",
                        "422",
                        "428",
                        "429",
                    ]
                },
                # Off by default in Schemathesis; on here with a generous bound.
                "max_response_time": 5.0,
            },
            "operations": [
                {
                    # A Stripe signature cannot be generated from a schema: every generated
                    # webhook is (rightly) refused with 400 signature_invalid.
                    "include-path": "/webhooks/stripe",
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": ["2xx", "400", "429"]}
                    },
                },
                {
                    # The thin-event destination: the same, or 404 without its own secret.
                    "include-path": "/webhooks/stripe/thin",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "400", "404", "429"]
                        }
                    },
                },
            ],
        }
    )


@pytest.fixture(scope="module")
def api(settings: Settings, tmp_path_factory: Any) -> Iterator[Served]:
    with serve(
        settings,
        tmp_path_factory.mktemp("schemathesis"),
        workers=2,
        FAIRMETER_STRIPE_WEBHOOK_SECRET="whsec_schemathesis",
        # A status stream the fuzzer opens is a right answer (200, text/event-stream) that
        # would last FAIRMETER_STREAM_MAX_S: end each one soon, as every client must expect.
        FAIRMETER_STREAM_MAX_S="2",
        FAIRMETER_STREAM_HEARTBEAT_S="1",
    ) as served:
        yield served


def failures_of(base: str, key: str) -> list[str]:
    schema = schemathesis.openapi.from_url(f"{base}/schema/openapi.json", config=config(key))
    found: dict[tuple[str, str, str], str] = {}
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            for checks in event.recorder.checks.values():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        info = check.failure_info
                        label = (event.recorder.label, check.name, info.failure.title)
                        found.setdefault(label, info.code_sample)
        elif isinstance(event, events.NonFatalError | events.FatalError):
            found[("engine", "error", str(event.info))] = ""
    return [
        f"{op} | {check} | {title}\n    {sample}" for (op, check, title), sample in found.items()
    ]


@pytest.mark.parametrize("scope", ["ingest", "customer", "support", "admin"])
def test_schemathesis_finds_nothing(api, engine, settings, make_key, db, scope):
    # Its own tenant: the fuzzer writes policy versions, which are append-only and would
    # otherwise change how later tests' runs of a shared tenant are settled.
    data = seed_tenant(engine, settings, tenant=f"fuzz-{uuid.uuid4().hex[:10]}")
    customer = data.customer if scope == "customer" else None
    key = make_key(tenant=data.tenant, scope=scope, customer=customer)
    failures = failures_of(api.base, key)
    assert not failures, "\n".join(failures)
    assert "Traceback" not in api.logs(), api.logs()
