"""The append-only ledger: pure postings (here) and their storage (``repo``)."""
