"""The ``memory`` table from Kineto ``[memory]`` instant events (``profile_memory=True``).

PyTorch's profiler writes one instant event per CUDA caching-allocator call::

    {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": .., "tid": ..,
     "ts": 1419247333400.919, "args": {"Total Reserved": 121634816, "Total Allocated": 91505152,
     "Bytes": 144384, "Addr": 128184607182336, "Device Id": 0, "Device Type": 1}}

``Bytes`` is positive for an allocation, negative for a free; the totals are
the allocator's state *after* the call. Device type 1 is CUDA; CPU rows
(type 0, or device id -1) are skipped. Older traces (2021) carry no totals:
their rows keep null totals and the analyzer rebuilds allocated bytes from the
deltas.

The general decoder (``decode``) does not read these args, so this
module finds the events by their name in the raw bytes (a C-speed search that
costs nothing on traces without them) and decodes each event object alone.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallscope.ingest.canonical import _as_int
from stallscope.ingest.formats import TableReader
from stallscope.schema import arrow_schema, empty_table

_MARK = b'"[memory]"'
# One JSON object with at most one level of nested objects (the ``args``).
_OBJECT = re.compile(rb"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")
CUDA_DEVICE_TYPE = 1


class _MemArgs(msgspec.Struct, gc=False):
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")
    addr: Any = msgspec.field(default=None, name="Addr")
    nbytes: Any = msgspec.field(default=None, name="Bytes")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    external_id: Any = msgspec.field(default=None, name="External id")


class _MemEvent(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = msgspec.Raw(b"")
    args: _MemArgs | None = None


_DECODER = msgspec.json.Decoder(_MemEvent)
_LIST_DECODER = msgspec.json.Decoder(list[_MemEvent])


def memory_table(data: bytes | bytearray | memoryview, trace_id: str) -> tuple[pa.Table, int]:
    """(the ``memory`` rows of CUDA devices, in file order; count of unreadable ``[memory]`` events).

    ``ts_ns`` is on the same clock as the other canonical tables (the
    trace's µs ``ts`` times 1000, exactly).
    """
    rows = MemoryRows()
    rows.add(data)
    return rows.table(trace_id)


class MemoryRows:
    """:func:`memory_table` over a document read in parts (``stream.py``): :meth:`add` each
    part in file order, each cut between events (an event's object never spans two parts),
    then :meth:`table`. The rows and count are those of the parts joined."""

    def __init__(self) -> None:
        self.parts: list[pa.Table] = []
        self.unreadable = 0
        self.found = False  # a "[memory]" event object was seen

    def add(self, data: bytes | bytearray | memoryview) -> None:
        view = bytes(data) if isinstance(data, memoryview) else data
        chunks, missing = _event_objects(view)
        self.unreadable += missing
        if not chunks:
            return
        self.found = True
        kept = _typed_rows(chunks)
        if kept is None:
            kept, unreadable = _kept_one_by_one(chunks)
            self.unreadable += unreadable
        self.parts.append(kept)

    def table(self, trace_id: str) -> tuple[pa.Table, int]:
        if not self.found:
            return empty_table("memory"), self.unreadable
        kept = pa.concat_tables(self.parts)
        self.parts = []
        return _memory_rows(kept, trace_id), self.unreadable


def _event_objects(view: bytes | bytearray) -> tuple[list[bytes], int]:
    """The JSON text of each object around a ``"[memory]"`` mark; count of marks with none.

    The object starts at the last ``{`` before the mark and is what
    :data:`_OBJECT` matches there (:func:`_object_end`).
    """
    chunks: list[bytes] = []
    missing = 0
    find, rfind = view.find, view.rfind
    position = find(_MARK)
    while position >= 0:
        start = rfind(b"{", 0, position)
        end = _object_end(find, start) if start >= 0 else -1
        if end <= position:
            missing += 1
        else:
            chunks.append(bytes(view[start:end]))
        position = find(_MARK, position + len(_MARK))
    return chunks, missing


def _object_end(find: Callable[..., int], start: int) -> int:
    """``_OBJECT.match(view, start).end()``, or -1 where it does not match; ``find`` is ``view.find``.

    The same language walked brace by brace with C-speed searches (3x faster
    than the regex here): ``{``, then at most one level of nested ``{...}``,
    then the ``}`` that closes it; a brace nested deeper, or none closing, is no match.
    """
    position, nested = start + 1, False
    while True:
        close = find(b"}", position)
        if close < 0:
            return -1
        opening = find(b"{", position, close)
        if opening >= 0:  # a brace opens before the next one closes
            if nested:
                return -1
            nested, position = True, opening + 1
        elif nested:
            nested, position = False, close + 1
        else:
            return close + 1


class _TypedMemArgs(msgspec.Struct, gc=False):
    """:class:`_MemArgs` with every value an integer (or absent / null), as PyTorch writes them."""

    device_type: int | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=None, name="Device Id")
    addr: int | None = msgspec.field(default=None, name="Addr")
    nbytes: int | None = msgspec.field(default=None, name="Bytes")
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: int | None = msgspec.field(default=None, name="Total Reserved")
    external_id: int | None = msgspec.field(default=None, name="External id")


class _TypedMemEvent(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = None
    pid: int | None = None
    tid: int | None = None
    ts: msgspec.Raw = msgspec.Raw(b"")
    args: _TypedMemArgs | None = None


_TYPED_LIST_DECODER = msgspec.json.Decoder(list[_TypedMemEvent])
_NO_TYPED_ARGS = _TypedMemArgs()


_TYPED_BATCH = 16_384  # events decoded at a time: bounds the Python objects alive at once


def _typed_rows(chunks: list[bytes]) -> pa.Table | None:
    """The CUDA ``[memory]`` events' values (:data:`_KEPT`), column by column; None if any
    value is odd.

    Applies when every event decodes with integer (or absent) ids, sizes and
    totals in the int64 range: what PyTorch writes. Anything else (a string
    or float value, a bad event) returns None and the caller goes event by
    event (:func:`_kept_one_by_one`), so the result is the same either way. The events are decoded
    :data:`_TYPED_BATCH` at a time (one batch's objects alive at once, not
    every event's: ~330 MB less at the peak of a 486 MB trace).
    """
    parts = []
    was_enabled = gc.isenabled()
    gc.disable()  # many small objects per event: the GC would only walk them again and again
    try:
        for start in range(0, len(chunks), _TYPED_BATCH):
            part = _typed_batch(chunks[start : start + _TYPED_BATCH])
            if part is None:
                return None
            parts.append(part)
    finally:
        if was_enabled:
            gc.enable()
    return pa.Table.from_batches(parts).select(list(_KEPT)) if parts else None


# The values of a kept event, before the ``memory`` table is made of them (:func:`_memory_rows`).
_KEPT = ("ts_ns", "pid", "tid", "device_id", "addr", "nbytes", "total_allocated",
         "total_reserved", "external_id")  # fmt: skip


def _memory_rows(kept: pa.Table, trace_id: str) -> pa.Table:
    """The ``memory`` table of the kept events (:data:`_KEPT`), in order."""
    n = kept.num_rows
    device = kept["device_id"]
    nbytes = kept["nbytes"]
    return pa.table(
        {
            "trace_id": pa.array([trace_id] * n, pa.string()),
            "device": pc.if_else(pc.less(device, 1 << 31), device, None).cast(pa.int32()),
            "ts_ns": kept["ts_ns"],
            "bytes": nbytes,
            "total_allocated": kept["total_allocated"],
            "total_reserved": kept["total_reserved"],
            "addr": kept["addr"],
            "pid": kept["pid"],
            "tid": kept["tid"],
            "external_id": kept["external_id"],
            "seq": pa.array(range(n), pa.int64()),
            "source": pa.array(["kineto"] * n, pa.string()),
            "action": pc.if_else(
                pc.less(nbytes.fill_null(0), 0), pa.scalar("free"), pa.scalar("alloc")
            ),
            "stack": pa.nulls(n, pa.string()),
        },
        schema=arrow_schema("memory"),
    )


def _kept_one_by_one(chunks: list[bytes]) -> tuple[pa.Table, int]:
    """:func:`_typed_rows` for any values (converted one by one, as ``_as_int`` reads them);
    also the count of events that do not decode."""
    columns: dict[str, list[Any]] = {name: [] for name in _KEPT}
    unreadable = 0
    for event in _decode_all(chunks):
        if event is None:
            unreadable += 1
        elif event.name == "[memory]" and event.ph == "i":
            _append_kept(columns, event)
    table = pa.table({name: pa.array(values, pa.int64()) for name, values in columns.items()})
    return table, unreadable


_ARG_NAMES = _TypedMemArgs.__struct_fields__


def _typed_batch(chunks: list[bytes]) -> pa.RecordBatch | None:
    """The kept rows of some events (integer columns and ``ts_ns``); None if any value is odd."""
    try:
        events = _TYPED_LIST_DECODER.decode(b"[" + b",".join(chunks) + b"]")
        # One list per value (comprehensions and attrgetter: no tuple per event).
        filled = [e.args or _NO_TYPED_ARGS for e in events]
        ints = {
            "pid": pa.array([e.pid for e in events], pa.int64()),
            "tid": pa.array([e.tid for e in events], pa.int64()),
            **{key: pa.array(list(map(attrgetter(key), filled)), pa.int64()) for key in _ARG_NAMES},
        }
    except (msgspec.DecodeError, msgspec.ValidationError, pa.ArrowException, OverflowError):
        return None
    ts_ns = _ts_column([e.ts for e in events])
    memory_events = pa.array([e.name == "[memory]" and e.ph == "i" for e in events], pa.bool_())
    keep = pc.and_(
        pc.and_(memory_events, pc.is_valid(ts_ns)),
        pc.and_(pc.equal(ints["device_type"], 1), pc.greater_equal(ints["device_id"], 0)),
    ).fill_null(False)
    return pa.RecordBatch.from_pydict(
        {"ts_ns": ts_ns.filter(keep), **{key: value.filter(keep) for key, value in ints.items()}}
    )


def _ts_column(values: list[msgspec.Raw]) -> pa.Array:
    """:func:`_ts_ns` of each value: plain numbers vectorised, other spellings one by one."""
    from stallscope.ingest.kineto.decode import plain_ns, raw_text

    fast = plain_ns(raw_text(values))
    if fast.null_count == 0:
        return fast
    odd = np.flatnonzero(fast.is_null().to_numpy(zero_copy_only=False))
    slow = pa.array([_ts_ns(bytes(values[i])) for i in odd.tolist()], pa.int64())
    positions = np.arange(len(values), dtype=np.int64)
    positions[odd] = len(values) + np.arange(len(odd))
    return pa.concat_arrays([fast, slow]).take(pa.array(positions))


def _decode_all(chunks: list[bytes]) -> list[_MemEvent | None]:
    """All events in one decoder call; one by one (None for a bad one) when that fails."""
    try:
        return list(_LIST_DECODER.decode(b"[" + b",".join(chunks) + b"]"))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return [_decode(chunk) for chunk in chunks]


def _decode(chunk: bytes) -> _MemEvent | None:
    try:
        return _DECODER.decode(chunk)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _append_kept(columns: dict[str, list[Any]], event: _MemEvent) -> None:
    args = event.args or _MemArgs()
    device = _as_int(args.device_id)
    if _as_int(args.device_type) != CUDA_DEVICE_TYPE or device is None or device < 0:
        return  # CPU memory: not this table's subject
    ts_ns = _ts_ns(bytes(event.ts))
    if ts_ns is None:
        return
    columns["ts_ns"].append(ts_ns)
    columns["pid"].append(_as_int(event.pid))
    columns["tid"].append(_as_int(event.tid))
    columns["device_id"].append(device)
    columns["addr"].append(_as_int(args.addr))
    columns["nbytes"].append(_as_int(args.nbytes))
    columns["total_allocated"].append(_as_int(args.total_allocated))
    columns["total_reserved"].append(_as_int(args.total_reserved))
    columns["external_id"].append(_as_int(args.external_id))


def _ts_ns(text: bytes) -> int | None:
    """Kineto µs text (``1419247333400.919``) -> exact integer ns; None when unreadable."""
    try:
        value = Decimal(text.strip(b'" ').decode("ascii"))
    except (InvalidOperation, UnicodeDecodeError, ValueError):
        return None
    if not value.is_finite():
        return None
    ns = int((value * 1000).to_integral_value())
    return ns if -(1 << 63) <= ns < (1 << 63) else None


# The memory table, found by parse.py: it reads the events before the decoder, from the raw bytes.
TABLE_READER = TableReader("memory", memory_table, skipped="[memory] events", pieces=MemoryRows)
