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

import re
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec
import pyarrow as pa

from stallscope.ingest.canonical import _as_int
from stallscope.schema import arrow_schema

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
    columns: dict[str, list[Any]] = {name: [] for name in arrow_schema("memory").names}
    view = bytes(data) if isinstance(data, memoryview) else data
    chunks, unreadable = _event_objects(view)
    for event in _decode_all(chunks):
        if event is None:
            unreadable += 1
        elif event.name == "[memory]" and event.ph == "i":
            _append_row(columns, event, trace_id)
    return pa.Table.from_pydict(columns, schema=arrow_schema("memory")), unreadable


def _event_objects(view: bytes | bytearray) -> tuple[list[bytes], int]:
    """The JSON text of each object around a ``"[memory]"`` mark; count of marks with none."""
    chunks: list[bytes] = []
    missing = 0
    position = view.find(_MARK)
    while position >= 0:
        start = view.rfind(b"{", 0, position)
        match = _OBJECT.match(view, start) if start >= 0 else None
        if match is None or match.end() <= position:
            missing += 1
        else:
            chunks.append(bytes(view[match.start() : match.end()]))
        position = view.find(_MARK, position + len(_MARK))
    return chunks, missing


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


def _append_row(columns: dict[str, list[Any]], event: _MemEvent, trace_id: str) -> None:
    args = event.args or _MemArgs()
    device = _as_int(args.device_id)
    if _as_int(args.device_type) != CUDA_DEVICE_TYPE or device is None or device < 0:
        return  # CPU memory: not this table's subject
    ts_ns = _ts_ns(bytes(event.ts))
    if ts_ns is None:
        return
    columns["trace_id"].append(trace_id)
    columns["device"].append(device if device < (1 << 31) else None)
    columns["ts_ns"].append(ts_ns)
    columns["bytes"].append(_as_int(args.nbytes))
    columns["total_allocated"].append(_as_int(args.total_allocated))
    columns["total_reserved"].append(_as_int(args.total_reserved))
    columns["addr"].append(_as_int(args.addr))
    columns["pid"].append(_as_int(event.pid))
    columns["tid"].append(_as_int(event.tid))
    columns["external_id"].append(_as_int(args.external_id))
    columns["seq"].append(len(columns["seq"]))
    columns["source"].append("kineto")
    columns["action"].append("free" if (columns["bytes"][-1] or 0) < 0 else "alloc")
    columns["stack"].append(None)


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
