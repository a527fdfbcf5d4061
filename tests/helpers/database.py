"""Facts about the test database that fixtures in more than one directory rely on."""

from __future__ import annotations

# The pepper the test settings hash API keys with; a test that starts its own process or
# reads the stored hashes needs the same one.
TEST_PEPPER = "test-pepper-0123456789abcdef0123456789abcdef"  # strong enough to serve (32+ bytes)
# Tables that hold a test's data; prices and the schema version survive between tests, and
# so do the append-only policy_versions and policy_withdrawals, which refuse TRUNCATE: each
# test that writes a policy uses a tenant of its own.
DATA_TABLES = (
    "webhook_attempts",
    "webhook_messages",
    "webhook_endpoints",
    "webhook_fanout",
    "notifications",
    "statement_closings",
    "audit_log",
    "disputes",
    "support_credits",
    "statement_lines",
    "statement_totals",
    "stripe_deliveries",
    "stripe_delivery_keys",
    "stripe_outbox",
    "stripe_customer_leases",
    "stripe_carries",
    "stripe_webhook_inbox",
    "stripe_closed_periods",
    "stripe_invoices",
    "decisions",
    "ledger_entries",
    "usage_lines",
    "events",
    "event_keys",
    "archived_months",
    "runs",
    "console_sessions",
    "api_keys",
    "customers",
    "tenants",
)
