"""PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``) -> the ``memory`` table.

A snapshot is a pickle of plain Python values (the format pytorch.org/memory_viz
reads)::

    {"segments": [{"device": 0, "address": .., "total_size": .., "allocated_size": ..,
                   "is_expandable": False, "blocks": [{"address": .., "size": ..,
                   "state": "active_allocated" | "active_pending_free" | "inactive",
                   "frames": [..]}, ..]}, ..],
     "device_traces": [[{"action": "alloc" | "free_requested" | "free_completed" |
                         "segment_alloc" | "segment_free" | "segment_map" | "segment_unmap" |
                         "snapshot" | "oom", "addr": .., "size": .., "stream": ..,
                         "time_us": .., "frames": [{"filename": .., "line": .., "name": ..}]}, ..],
                       ..],   # one list per device, oldest first
     "allocator_settings": {..}}

**Safety.** The file is untrusted: :class:`PlainUnpickler` refuses every
global (class, function, module attribute), so unpickling can only build
dicts, lists, tuples, sets, strings, bytes, numbers, booleans and None; it
never imports or calls anything. A snapshot holding any other object is
refused with a one-line error.

**Totals.** The trace ring buffer may have lost its oldest entries, but the
segments give the allocator's state when the snapshot was taken: the totals
after each trace entry are that final state minus the changes that came
after it (allocated from ``alloc``/``free_completed``, reserved from the
segment actions). Rows are one per change; ``action`` says which (docs/schema.md).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import pyarrow as pa

from stallscope.errors import InputError
from stallscope.ingest.canonical import CanonicalTrace, _as_int
from stallscope.ingest.formats import ParseContext, ParsedTrace
from stallscope.ingest.reader import Source
from stallscope.schema import arrow_schema

PICKLE_HEAD = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
# action -> (allocated sign, reserved sign)
_CHANGES = {
    "alloc": (1, 0),
    "free_completed": (-1, 0),
    "segment_alloc": (0, 1),
    "segment_map": (0, 1),
    "segment_free": (0, -1),
    "segment_unmap": (0, -1),
}
STACK_FRAMES = 4
_INTERNAL = ("torch/", "<frozen", "threading.py", "runpy.py")


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain values: every global lookup is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused to load {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused a persistent id")


def load_plain(data: bytes) -> Any:
    """The value pickled in ``data``, built from plain Python values only (see module docstring)."""
    return PlainUnpickler(io.BytesIO(data)).load()


def is_snapshot_pickle(head: bytes) -> bool:
    return head.startswith(PICKLE_HEAD)


def parse_snapshot(source: Source, data: bytes, ctx: ParseContext) -> list[ParsedTrace]:
    """One trace whose only table is ``memory``; its rank (a snapshot records none) is set
    once the job is parsed (:func:`~stallscope.ingest.memory_snapshot.pair.pair_snapshots`)."""
    try:
        snapshot = load_plain(data)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
            KeyError, AttributeError, OverflowError) as exc:  # fmt: skip
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(
            source.name,
            f"Python pickle that is not a plain CUDA memory snapshot ({reason}); "
            "stallscope reads torch.cuda.memory._dump_snapshot() files only",
        ) from None
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("device_traces"), list):
        raise InputError(
            source.name,
            "Python pickle without device_traces: not a CUDA memory snapshot "
            "(record one with torch.cuda.memory._record_memory_history() then _dump_snapshot())",
        )
    trace_id = ctx.trace_id("")
    table, warnings = snapshot_table(snapshot, trace_id)
    if table.num_rows == 0:
        raise InputError(
            source.name,
            "empty memory snapshot: no allocator events were recorded "
            "(call torch.cuda.memory._record_memory_history() before the code to profile)",
        )
    canonical = CanonicalTrace(memory=table, event_count=table.num_rows)
    return [
        ParsedTrace(key="", canonical=canonical, source="memory-snapshot", source_version=None,
                    rank=None, warnings=warnings)
    ]  # fmt: skip


def snapshot_table(snapshot: dict[str, Any], trace_id: str) -> tuple[pa.Table, list[str]]:
    """The ``memory`` rows of a snapshot (see the module docstring), and warnings."""
    columns: dict[str, list[Any]] = {name: [] for name in arrow_schema("memory").names}
    warnings: list[str] = []
    segments = [s for s in snapshot.get("segments") or [] if isinstance(s, dict)]
    for device, entries in enumerate(snapshot["device_traces"]):
        entries = [e for e in entries or [] if isinstance(e, dict) and e.get("action") in _CHANGES]
        if not entries and not any(_as_int(s.get("device")) == device for s in segments):
            continue
        mine = [s for s in segments if _as_int(s.get("device")) == device]
        _device_rows(columns, trace_id, device, entries, mine, warnings)
    return pa.Table.from_pydict(columns, schema=arrow_schema("memory")), warnings


def _device_rows(columns, trace_id, device, entries, segments, warnings) -> None:
    sizes = [_as_int(e.get("size")) or 0 for e in entries]
    final_allocated = sum(_as_int(s.get("allocated_size")) or 0 for s in segments)
    final_reserved = sum(_as_int(s.get("total_size")) or 0 for s in segments)
    known = bool(segments) or not entries
    allocated, reserved = final_allocated, final_reserved
    after: list[tuple[int, int]] = []
    for entry, size in zip(reversed(entries), reversed(sizes), strict=True):
        after.append((allocated, reserved))
        a_sign, r_sign = _CHANGES[entry["action"]]
        allocated -= a_sign * size
        reserved -= r_sign * size
    after.reverse()
    times = [_as_int(e.get("time_us")) for e in entries]
    timed = all(t is not None for t in times)
    if entries and not timed:
        warnings.append(
            f"device {device}: the snapshot records no times (PyTorch < 2.1): "
            "its events are placed 1 µs apart in order"
        )
    seq = len(columns["seq"])
    last_ns = 0
    for i, (entry, size) in enumerate(zip(entries, sizes, strict=True)):
        ts_ns = times[i] * 1000 if timed else i * 1000
        last_ns = ts_ns
        a_sign, r_sign = _CHANGES[entry["action"]]
        _row(columns, trace_id, device, ts_ns, entry["action"], (a_sign or r_sign) * size,
             after[i] if known else (None, None), _as_int(entry.get("addr")),
             _stack(entry.get("frames")), seq + i)  # fmt: skip
    for s in segments:  # the free blocks when the snapshot was taken
        for block in s.get("blocks") or []:
            if isinstance(block, dict) and block.get("state") == "inactive":
                _row(columns, trace_id, device, last_ns, "free_block", _as_int(block.get("size")),
                     (None, None), _as_int(block.get("address")), None, len(columns["seq"]))  # fmt: skip


def _row(columns, trace_id, device, ts_ns, action, nbytes, totals, addr, stack, seq) -> None:
    values = {
        "trace_id": trace_id, "device": device, "ts_ns": ts_ns, "bytes": nbytes,
        "total_allocated": totals[0], "total_reserved": totals[1], "addr": addr, "pid": None,
        "tid": None, "external_id": None, "seq": seq, "source": "snapshot", "action": action,
        "stack": stack,
    }  # fmt: skip
    for name in arrow_schema("memory").names:
        columns[name].append(values[name])


def _stack(frames: Any) -> str | None:
    """The first few user frames (PyTorch internals skipped) as ``name (file:line)``, innermost first."""
    if not isinstance(frames, list):
        return None
    shown = []
    for frame in frames:
        if not isinstance(frame, dict):
            continue
        filename = str(frame.get("filename", ""))
        if not filename.endswith(".py") or any(part in filename for part in _INTERNAL):
            continue
        shown.append(
            f"{frame.get('name', '?')} ({filename.rsplit('/', 1)[-1]}:{frame.get('line', '?')})"
        )
        if len(shown) == STACK_FRAMES:
            break
    return " ← ".join(shown) or None
