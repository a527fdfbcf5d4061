"""Benchmarks; results are written to docs/benchmarks.md."""
