"""The file digest of archive format 2: the rows as Arrow holds them, encoded in bulk.

Format 1 (``archive_plan.row_hash``) hashed Python's ``repr`` of every value of every row,
once on the rows written and again on the rows read back from the file: some 8 µs a row in
Python, most of the time an archive took. Format 2 hashes the same rows as Arrow holds them
(the batches written to the Parquet file, the batches read back from it): Arrow's kernels
encode every row into one byte string, column by column, and Python only hashes one bytes
object a row. Both sides are Arrow data of the same schema, so the digest of the file read
back equals the digest of the batches written exactly when the file holds those values.
That the batches hold the partition's rows is what the SQL digest (``archive_plan``) proves.

The encoding of a row is unambiguous: each field is ``N`` for NULL, else ``<length>:<bytes>``
(the byte length in decimal), and the fields are joined by ``|``. The bytes: text as UTF-8,
bytea as it is, a time as its microseconds since the epoch (UTC), a list as its elements so
encoded joined by ``,`` (NULL elements kept, an empty list is ``0:``, a NULL list ``N``);
other values (integers, booleans, floats, dates) as Arrow prints them. A row's hash is the
SHA-256 of its encoding; the digest their sum modulo 2^256, as in format 1, so row order
and batch sizes do not matter.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

_MODULUS: Final = 2**256
_NULL: Final = b"N"


def _value_bytes(array: pa.Array) -> pa.Array:
    """Each value's bytes (binary), NULL where the value is NULL."""
    kind = array.type
    if pa.types.is_binary(kind):
        return array
    if pa.types.is_string(kind):
        return pc.cast(array, pa.binary())
    if pa.types.is_timestamp(kind):
        array = pc.cast(array, pa.int64())  # the instant, whatever the zone it is shown in
    if pa.types.is_list(kind):
        elements = field_bytes(pc.list_flatten(array))
        lengths = pc.fill_null(pc.list_value_length(array), 0)
        offsets = pa.concat_arrays(
            [pa.array([0], pa.int32()), pc.cumulative_sum(lengths).cast(pa.int32())]
        )
        lists = pa.ListArray.from_arrays(offsets, elements, mask=pc.is_null(array))
        return pc.binary_join(lists, b",")
    return pc.cast(pc.cast(array, pa.string()), pa.binary())


def field_bytes(array: pa.Array) -> pa.Array:
    """Each value encoded as one field of a row: ``N`` or ``<length>:<bytes>``."""
    values = _value_bytes(array)
    lengths = pc.cast(pc.cast(pc.binary_length(values), pa.string()), pa.binary())
    return pc.fill_null(pc.binary_join_element_wise(lengths, values, b":"), _NULL)


def row_bytes(batch: pa.RecordBatch) -> pa.Array:
    """Each row of the batch encoded as one byte string."""
    return pc.binary_join_element_wise(*(field_bytes(c) for c in batch.columns), b"|")


@dataclass(slots=True)
class ArrowDigest:
    """Rows seen and their order-independent digest, fed Arrow batch by batch."""

    rows: int = 0
    total: int = 0

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        total, sha256, from_bytes = self.total, hashlib.sha256, int.from_bytes
        for row in row_bytes(batch).to_pylist():
            total += from_bytes(sha256(row).digest(), "big")
        self.rows += batch.num_rows
        self.total = total % _MODULUS

    @property
    def hex(self) -> str:
        return f"{self.total:064x}"
