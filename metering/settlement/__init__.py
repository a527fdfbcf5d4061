"""Settlement: find due runs, lock them, load their facts, decide, post to the ledger."""
