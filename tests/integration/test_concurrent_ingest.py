"""32 concurrent clients each send the same 1,000 usage events 3 times: stored exactly once."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import httpx

from tests.helpers.events import iso

CLIENTS = 32
EVENTS = 1000
ROUNDS = 3
BATCH = 50
# Test catalog prices in micro-USD per million tokens (tests/helpers/prices.csv).
PRICES = {
    "agent-large-1": (3_000_000, 300_000, 15_000_000),
    "agent-small-1": (250_000, 25_000, 1_250_000),
    "agent-reasoner-2": (10_000_000, 2_500_000, 40_000_000),
}


def expected_cost(model: str, tokens: tuple[int, int, int]) -> int:
    """Independent oracle: Decimal arithmetic, round half even per token class."""
    total = 0
    for count, price in zip(tokens, PRICES[model], strict=True):
        exact = Decimal(count) * Decimal(price) / Decimal(1_000_000)
        total += int(exact.quantize(Decimal(1), rounding=ROUND_HALF_EVEN))
    return total


def build_events() -> tuple[list[dict[str, Any]], int, dict[str, int]]:
    rng = random.Random(20261130)
    now = datetime.now(UTC) - timedelta(minutes=10)
    events, total, per_customer = [], 0, {}
    for i in range(EVENTS):
        model = rng.choice(sorted(PRICES))
        # Odd token counts hit the half-even rounding on purpose.
        tokens = (rng.randint(0, 50_000), rng.randint(0, 20_000), rng.randint(1, 9_999))
        customer = f"cust-{i % 7}"
        events.append(
            {
                "specversion": "1.0",
                "id": f"u-{i}",
                "source": "gateway/edge-3",
                "type": "run.usage",
                "subject": f"run-{i % 40}-{customer}",
                "time": iso(now + timedelta(milliseconds=i)),
                "data": {
                    "customer": customer,
                    "step": i,
                    "model": model,
                    "input_tokens": tokens[0],
                    "cached_input_tokens": tokens[1],
                    "output_tokens": tokens[2],
                },
            }
        )
        cost = expected_cost(model, tokens)
        total += cost
        per_customer[customer] = per_customer.get(customer, 0) + cost
    return events, total, per_customer


def client_sends_everything(base: str, key: str, events: list[dict[str, Any]], seed: int) -> int:
    rng = random.Random(seed)
    accepted = 0
    headers = {
        "authorization": f"Bearer {key}",
        "content-type": "application/cloudevents-batch+json",
    }
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        for _ in range(ROUNDS):
            batches = [events[i : i + BATCH] for i in range(0, len(events), BATCH)]
            rng.shuffle(batches)
            for batch in batches:
                reply = http.post("/v1/events", content=json.dumps(batch))
                assert reply.status_code == 200, reply.text
                accepted += reply.json()["accepted"]
    return accepted


def test_concurrent_retries_store_each_event_once_with_exact_totals(live_server, make_key, db):
    key = make_key()
    events, expected_total, expected_per_customer = build_events()
    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        accepted = sum(
            pool.map(
                lambda seed: client_sends_everything(live_server, key, events, seed), range(CLIENTS)
            )
        )
    assert accepted == EVENTS  # every event reported "accepted" to exactly one client
    assert db.execute("SELECT count(*) FROM events").fetchone() == (EVENTS,)
    assert db.execute("SELECT count(*) FROM usage_lines").fetchone() == (EVENTS,)
    holds = db.execute(
        "SELECT customer_id, sum(amount_micros), count(*) FROM ledger_entries "
        "WHERE kind = 'hold' GROUP BY customer_id"
    ).fetchall()
    assert {c: int(s) for c, s, _ in holds} == expected_per_customer
    assert sum(int(s) for _, s, _ in holds) == expected_total
    assert db.execute("SELECT sum(event_count) FROM runs").fetchone() == (EVENTS,)
