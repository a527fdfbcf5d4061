"""The append-only ledger: pure postings (``postings``) and the one place they are written
(``repo``)."""
