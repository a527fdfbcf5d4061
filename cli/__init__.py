"""The ``fairmeter`` command line: parses arguments, calls one use case, prints."""
