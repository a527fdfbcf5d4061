"""Support use cases: disputes, credits, releasing held runs, and the audit log."""
