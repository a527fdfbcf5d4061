"""The price catalog's storage: load a catalog file, read the table, cache it per process.

The catalog changes rarely and is read on every usage event, so each process keeps an
immutable :class:`~metering.pricing.PriceCatalog` and reloads it after a short TTL, or at once
when an event names a model it does not know (a freshly loaded model works immediately).
"""

from __future__ import annotations

import csv
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg

from metering.errors import FieldError, validation_error
from metering.pricing import Price, PriceCatalog, TokenClass
from metering.timestamps import parse_rfc3339

SAMPLE_CATALOG = "sample_prices.csv"


def read_catalog_file(path: Path | None = None) -> list[Price]:
    """Parse a catalog CSV (``model,token_class,micros_per_mtok,effective_from``).

    Every bad row is reported with its line number; nothing is loaded from a bad file.
    """
    if path is None:
        text = resources.files("metering.data").joinpath(SAMPLE_CATALOG).read_text()
    else:
        text = path.read_text()
    prices, errors = [], []
    for line_no, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        try:
            moment = parse_rfc3339(row["effective_from"])
            micros = int(row["micros_per_mtok"])
            if moment is None or micros < 0:
                raise ValueError("bad time or negative price")
            prices.append(Price(row["model"], TokenClass(row["token_class"]), micros, moment))
        except (KeyError, ValueError, TypeError) as exc:
            errors.append(FieldError(f"line {line_no}", "invalid_price", str(exc)))
    if errors:
        raise validation_error(errors, "the price catalog file has invalid rows")
    return prices


def insert_prices(conn: psycopg.Connection[Any], prices: Iterable[Price]) -> int:
    """Add prices; a row already present (same model, class, start) is left as it is."""
    added = 0
    with conn.cursor() as cur:
        for price in prices:
            cur.execute(
                "INSERT INTO prices (model, token_class, micros_per_mtok, effective_from) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (price.model, price.token_class.value, price.micros_per_mtok, price.effective_from),
            )
            added += cur.rowcount
    return added


def load_catalog(conn: psycopg.Connection[Any]) -> PriceCatalog:
    with conn.cursor() as cur:
        cur.execute("SELECT model, token_class, micros_per_mtok, effective_from FROM prices")
        rows: list[tuple[str, str, int, datetime]] = cur.fetchall()
    return PriceCatalog.from_prices(Price(m, TokenClass(c), p, t) for m, c, p, t in rows)


class CatalogCache:
    """A per-process, thread-safe cache of the catalog with a TTL."""

    def __init__(self, loader: Callable[[], PriceCatalog], ttl_s: float = 10.0) -> None:
        self._loader = loader
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._catalog: PriceCatalog | None = None
        self._loaded_at = 0.0

    def current(self) -> PriceCatalog:
        if self._catalog is None or time.monotonic() - self._loaded_at > self._ttl_s:
            return self.refresh()
        return self._catalog

    def fresh(self) -> PriceCatalog | None:
        """The cached catalog while it is within its TTL, else ``None`` (never loads)."""
        if self._catalog is None or time.monotonic() - self._loaded_at > self._ttl_s:
            return None
        return self._catalog

    def refresh(self) -> PriceCatalog:
        with self._lock:
            self._catalog = self._loader()
            self._loaded_at = time.monotonic()
            return self._catalog
