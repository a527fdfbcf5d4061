"""History that grows: the append-only tables kept as monthly partitions (issue #18)."""
