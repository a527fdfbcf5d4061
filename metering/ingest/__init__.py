"""Ingest: validate CloudEvents (pure) and store them with their holds (one transaction)."""
