"""The catalogs' storage: load a catalog file, read the table, cache it per process.

Two catalogs share this code: the prices customers are billed and the provider costs the
platform pays (for the cost of protection report).

The catalog changes rarely and is read on every usage event, so each process keeps an
immutable :class:`~metering.pricing.PriceCatalog` and reloads it after a short TTL, or at once
when an event names a model it does not know (a freshly loaded model works immediately).
"""

from __future__ import annotations

import csv
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from metering.errors import FieldError, validation_error
from metering.pricing import Price, PriceCatalog, TokenClass
from metering.timestamps import parse_rfc3339


@dataclass(frozen=True, slots=True)
class CatalogKind:
    """One effective-dated catalog of micro-USD per million tokens: what customers pay
    (``PRICES``) or what the provider charges the platform (``PROVIDER_COSTS``).

    Both share one file shape, one parser and one lookup (:class:`PriceCatalog`); only the
    table, the shipped sample and the words in errors differ.
    """

    table: str
    sample: str
    noun: str


PRICES = CatalogKind(table="prices", sample="sample_prices.csv", noun="price")
PROVIDER_COSTS = CatalogKind(
    table="provider_costs", sample="sample_provider_costs.csv", noun="provider cost"
)
SAMPLE_CATALOG = PRICES.sample
COLUMNS = ("model", "token_class", "micros_per_mtok", "effective_from")


def _parse_row(
    row: dict[str, str | None], where: str, kind: CatalogKind
) -> Price | list[FieldError]:
    """One CSV row as a Price, or every bad field in it (path ``line N.field``)."""
    code = f"invalid_{kind.noun.replace(' ', '_')}"
    errors = [
        FieldError(f"{where}.{name}", code, "missing") for name in COLUMNS if not row.get(name)
    ]
    if errors:
        return errors
    model, token_class = str(row["model"]), str(row["token_class"])
    if token_class not in {c.value for c in TokenClass}:
        known = ", ".join(TokenClass)
        errors.append(FieldError(f"{where}.token_class", code, f"must be one of {known}"))
    micros = str(row["micros_per_mtok"]).strip()
    if not micros.isdigit():
        errors.append(FieldError(f"{where}.micros_per_mtok", code, "must be a whole number ≥ 0"))
    moment = parse_rfc3339(str(row["effective_from"]))
    if moment is None:
        errors.append(FieldError(f"{where}.effective_from", code, "must be an RFC 3339 time"))
    if errors or moment is None:
        return errors
    return Price(model, TokenClass(token_class), int(micros), moment)


def read_catalog_file(path: Path | None = None, kind: CatalogKind = PRICES) -> list[Price]:
    """Parse a catalog CSV (``model,token_class,micros_per_mtok,effective_from``).

    Every bad row is reported with its line number and field; nothing is loaded from a bad
    file. No file: the shipped sample of that catalog.
    """
    if path is None:
        text = resources.files("metering.data").joinpath(kind.sample).read_text()
    else:
        text = path.read_text()
    prices: list[Price] = []
    errors: list[FieldError] = []
    for line_no, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        parsed = _parse_row(row, f"line {line_no}", kind)
        if isinstance(parsed, Price):
            prices.append(parsed)
        else:
            errors.extend(parsed)
    if errors:
        raise validation_error(errors, f"the {kind.noun} catalog file has invalid rows")
    return prices


def insert_prices(
    conn: psycopg.Connection[Any], prices: Iterable[Price], kind: CatalogKind = PRICES
) -> int:
    """Add entries; a row already present (same model, class, start) is left as it is."""
    added = 0
    with conn.cursor() as cur:
        for price in prices:
            cur.execute(
                sql.SQL(
                    "INSERT INTO {} (model, token_class, micros_per_mtok, effective_from) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"
                ).format(sql.Identifier(kind.table)),
                (price.model, price.token_class.value, price.micros_per_mtok, price.effective_from),
            )
            added += cur.rowcount
    return added


def load_catalog(conn: psycopg.Connection[Any], kind: CatalogKind = PRICES) -> PriceCatalog:
    """The whole catalog as an immutable, time-indexed lookup."""
    with conn.cursor() as cur:
        cur.execute(
            sql.SQL("SELECT model, token_class, micros_per_mtok, effective_from FROM {}").format(
                sql.Identifier(kind.table)
            )
        )
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
