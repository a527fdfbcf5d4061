# Fairmeter — the two commands are `make up` and `make test`.
SHELL := /bin/bash
UV = $(shell command -v uv 2>/dev/null || echo "python3 -m uv")
export UV_LINK_MODE ?= copy

.PHONY: up test lint typecheck unit bench bench-growth bench-soak bench-capacity install uv clean browser

uv:
	@command -v uv >/dev/null 2>&1 || python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet uv

# --compile-bytecode: where PYTHONDONTWRITEBYTECODE is set (CI) nothing is cached on import,
# and every process the tests start (a `fairmeter` command, a uvicorn or Celery worker, a
# process-pool child) compiled SQLAlchemy, pydantic, Litestar... from source again:
# `import api.app` took 9 s instead of 3 s. Compiled once here (a second or two when done).
install: uv
	@$(UV) sync --frozen --quiet --compile-bytecode

## Start the whole service (API, worker, beat) on embedded PostgreSQL/Redis unless
## DATABASE_URL / REDIS_URL are set. Ctrl-C stops everything it started.
up: install
	@$(UV) run --frozen fairmeter up $(ARGS)

## Lint, type-check and run the whole suite against real PostgreSQL, Redis and Celery.
test: install lint typecheck browser
	@$(UV) run --frozen pytest

## The browser tests' Chromium: the OS package (apt-get) where there is one, else
## Playwright's own build; installed only when missing, saying what it runs.
browser: install
	@$(UV) run --frozen python -m devtools.chromium

lint: install
	@$(UV) run --frozen ruff check .
	@$(UV) run --frozen ruff format --check .
	@$(UV) run --frozen lint-imports

typecheck: install
	@$(UV) run --frozen mypy metering reconciler api cli devtools clients/python/fairmeter_client

unit: install
	@$(UV) run --frozen pytest tests/unit

bench: install
	@$(UV) run --frozen python bench/ingest.py
	@$(UV) run --frozen python bench/settle.py
	@$(UV) run --frozen python bench/sweep.py
	@$(UV) run --frozen python bench/stripe_sync.py
	@$(UV) run --frozen python bench/statement.py
	@$(UV) run --frozen python -m bench.stream
	@$(UV) run --frozen python bench/webhooks.py
	@$(UV) run --frozen python bench/otlp.py

# Issue #18's growth bench: 10 M events of history written first (~GBs of disk, minutes),
# so it is not part of `make bench`. BENCH_GROWTH_ARGS="--events 300000" for a quick check.
bench-growth: install
	@$(UV) run --frozen python bench/growth.py $(BENCH_GROWTH_ARGS)

# Issue #18's memory soak: the real API, worker and beat ingest and settle 1 M events while
# the RSS of each process is sampled (minutes of both cores), so it is not part of
# `make bench` either. BENCH_SOAK_ARGS="--events 20000" for a quick check.
bench-soak: install
	@$(UV) run --frozen python bench/soak.py $(BENCH_SOAK_ARGS)

# Issue #18's capacity model: CPU seconds per event, run and webhook of each tier (API,
# worker, PostgreSQL), written into docs/scaling.md; a few minutes, so not in `make bench`.
# BENCH_CAPACITY_ARGS="--events 20000 --deliveries 1000" for a quick check.
bench-capacity: install
	@$(UV) run --frozen python bench/capacity.py $(BENCH_CAPACITY_ARGS)

clean:
	rm -rf .fairmeter .pytest_cache .mypy_cache .ruff_cache
