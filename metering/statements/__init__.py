"""Customer usage statements: the read side of decisions, per customer and month."""
