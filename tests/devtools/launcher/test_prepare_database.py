"""``fairmeter up`` prepares its database with both sample catalogs, so the console's cost of
protection page has provider costs from the first run."""

from __future__ import annotations

import psycopg

from devtools.launcher import prepare_database
from metering.prices import PROVIDER_COSTS, read_catalog_file
from tests.helpers.services import drop_database, recreate_database, server_database_url

SCRATCH = "fairmeter_test_prepare_database"


def test_the_sample_provider_costs_are_loaded_beside_the_prices(settings):
    url = recreate_database(server_database_url(), SCRATCH)
    try:
        prepare_database(settings.model_copy(update={"database_url": url}), demo=False)
        with psycopg.connect(url) as conn:
            (count,) = conn.execute("SELECT count(*) FROM provider_costs").fetchone()
        assert count == len(read_catalog_file(None, PROVIDER_COSTS))
    finally:
        drop_database(server_database_url(), SCRATCH)
