"""The source's rows gathered column by column and handed to Spark as Arrow ``RecordBatch``es.

A Python data source's ``read`` may yield ``pyarrow.RecordBatch``es in place of tuples
(PySpark 4.x). Spark then takes each batch as it is, where tuples are converted one value at a
time in the Python worker: per message the source only appends to a few lists, and pyarrow
builds each column from its list at once. A batch's schema must be exactly
``to_arrow_schema(schema, timezone="UTC")`` (Spark checks it), so the buffer builds every batch
with that schema.

Timestamps are appended as microseconds since the epoch (an int, or None), never as
``datetime`` objects.
"""

from __future__ import annotations

import array
import gc
import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from magnetar.common.runtime import GC_YOUNG_THRESHOLD
from magnetar.spark.schema import META_COLUMNS

#: Rows per RecordBatch handed to Spark (Spark's own default for Arrow batches).
ARROW_BATCH_ROWS = 10_000


class RowBuffer:
    """Columns of the rows of ``schema`` (the value's columns, then ``META_COLUMNS``) being
    gathered; ``take`` turns them into one RecordBatch and starts over."""

    def __init__(self, schema: StructType) -> None:
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.width = len(schema.fields) - len(META_COLUMNS)
        self._reset()

    def _reset(self) -> None:
        self.values: list[list[object]] = [[] for _ in range(self.width)]
        #: The first value column, for the untyped row (``value`` binary) appended directly.
        self.value = self.values[0]
        self.keys: list[str | None] = []
        self.topics: list[str] = []
        self.message_ids: list[bytes] = []
        self.publish_us: list[int | None] = []
        self.event_us: list[int | None] = []
        self.properties: list[dict[str, str]] = []

    def __len__(self) -> int:
        return len(self.keys)

    def append_values(self, values: tuple[object, ...]) -> None:
        """The typed columns of one row (``PayloadDecoder.decode``'s tuple)."""
        for column, value in zip(self.values, values, strict=True):
            column.append(value)

    def take(self) -> pa.RecordBatch:
        arrays = [
            column_array(column, field.type)
            for column, field in zip(self.values, self.arrow_schema, strict=False)
        ]
        meta = (
            self.keys,
            self.topics,
            self.message_ids,
            self.publish_us,
            self.event_us,
            self.properties,
        )
        fields = list(self.arrow_schema)[self.width :]
        arrays += [column_array(column, f.type) for column, f in zip(meta, fields, strict=True)]
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)
        self._reset()
        return batch


#: Binary columns up to this many bytes are built from one joined buffer (int32 offsets).
_MAX_JOINED = 2**31 - 1


def column_array(values: list, kind: pa.DataType) -> pa.Array:
    """``pa.array(values, type=kind)``; a binary column without nulls is built from its
    values joined and their offsets, which is many times faster for payload-sized values."""
    if kind == pa.binary():
        try:
            data = b"".join(values)
        except TypeError:  # a null among them
            return pa.array(values, type=kind)
        if len(data) <= _MAX_JOINED:
            offsets = array.array("i", itertools.accumulate(map(len, values), initial=0))
            return pa.Array.from_buffers(
                kind, len(values), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
            )
    return pa.array(values, type=kind)


def micros(ms: int) -> int | None:
    """A message's millisecond time as Arrow's microseconds; None for 0 (unset)."""
    return ms * 1000 if ms > 0 else None


@contextmanager
def collecting_less() -> Iterator[None]:
    """Python's young-generation threshold (700 allocations) has a task that creates a few
    objects per message spend more than half its time in the collector (3.4 against 1.4 us per
    message decoded from storage). Within a task's read or write, collect as Magnetar's own
    processes do (``common/runtime.py``); the Spark worker's setting is restored after."""
    before = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 50)
    try:
        yield
    finally:
        gc.set_threshold(*before)
