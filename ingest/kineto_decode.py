"""Decode Kineto (PyTorch Profiler) JSON into one flat Arrow table.

The JSON is decoded with msgspec into small typed structs, a chunk of events
at a time, and each chunk is turned into Arrow columns straight away, so peak
memory is the file's bytes plus one chunk of Python objects. Only the fields
that stallscope uses are decoded; everything else is skipped by the parser.

Numbers that carry time (``ts``, ``dur``) are kept as their exact JSON text
and converted to integer nanoseconds in SQL (see ``kineto_canonical``), so a
value such as ``1712195495519689.047`` (µs) keeps its nanoseconds.

Output contract (:class:`KinetoDecoded`): ``events`` has one row per trace
event with the columns of :data:`RAW_COLUMNS`; ``header`` holds the top-level
keys other than ``traceEvents`` (``deviceProperties``, ``distributedInfo``,
``schemaVersion``, ``baseTimeNanoseconds``, ...).
"""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from stallscope.errors import InputError

CHUNK_EVENTS = 100_000
_INT64_MAX = (1 << 63) - 1


def _f(name: str) -> Any:
    return msgspec.field(default=None, name=name)


class Args(msgspec.Struct, gc=False):
    """The ``args`` keys stallscope reads; values are loosely typed on purpose."""

    device: Any = None
    stream: Any = None
    correlation: Any = None
    external_id: Any = _f("External id")
    external_id_old: Any = _f("external id")
    grid: Any = None
    block: Any = None
    registers: Any = _f("registers per thread")
    shared_memory: Any = _f("shared memory")
    blocks_per_sm: Any = _f("blocks per SM")
    warps_per_sm: Any = _f("warps per SM")
    est_occupancy: Any = _f("est. achieved occupancy %")
    bytes: Any = None
    kind: Any = None
    sync_kind: Any = _f("cuda_sync_kind")
    wait_on_stream: Any = None
    collective: Any = _f("Collective name")
    in_nelems: Any = _f("In msg nelems")
    out_nelems: Any = _f("Out msg nelems")
    group_size: Any = _f("Group size")
    dtype: Any = None
    pg_name: Any = _f("Process Group Name")
    pg_desc: Any = _f("Process Group Description")
    pg_ranks: Any = _f("Process Group Ranks")
    seq: Any = _f("Seq")
    seq_alt: Any = _f("seq")
    meta_name: Any = _f("name")


class Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = msgspec.Raw(b"")
    dur: msgspec.Raw = msgspec.Raw(b"")
    args: Args | None = None


_EVENTS_LIST = msgspec.json.Decoder(list[Event])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.json.Decoder()

RAW_COLUMNS = (
    "ph", "cat", "name", "pid", "tid", "ts_txt", "dur_txt",
    "device", "stream", "correlation", "external_id",
    "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
    "registers", "shared_memory", "blocks_per_sm", "warps_per_sm", "est_occupancy",
    "bytes", "kind", "sync_kind", "wait_on_stream",
    "collective", "in_nelems", "out_nelems", "group_size", "dtype",
    "pg_name", "pg_desc", "pg_ranks", "seq", "meta_name",
)  # fmt: skip


@dataclass
class KinetoDecoded:
    events: pa.Table
    header: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def decode_kineto(name: str, data: bytes) -> KinetoDecoded:
    """Decode a Kineto JSON document (object with ``traceEvents`` or bare array)."""
    warnings: list[str] = []
    try:
        raws, header = _split_top(data)
    except msgspec.DecodeError:
        data, note = _repair(data)
        try:
            raws, header = _split_top(data)
        except msgspec.DecodeError as exc:
            raise InputError(name, _describe_json_error(exc, data)) from None
        warnings.append(note)
    if raws is None:
        raise InputError(name, "JSON without a traceEvents array: not a Kineto trace")
    batches = []
    was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived containers: the GC only slows this down
    try:
        for start in range(0, len(raws), CHUNK_EVENTS):
            chunk = raws[start : start + CHUNK_EVENTS]
            try:
                events = _EVENTS_LIST.decode(b"[" + b",".join(chunk) + b"]")
            except msgspec.DecodeError:
                events = _decode_one_by_one(chunk, warnings)
            except msgspec.ValidationError as exc:
                raise InputError(
                    name, f"not a Kineto trace: traceEvents holds non-event values ({exc})"
                ) from None
            batches.append(_to_batch(events))
            del events
    finally:
        if was_enabled:
            gc.enable()
    table = pa.Table.from_batches(batches) if batches else _empty_table()
    return KinetoDecoded(events=table, header=header, warnings=warnings)


def _split_top(data: bytes) -> tuple[list[msgspec.Raw] | None, dict[str, Any]]:
    """Top level -> (raw events, header). Raises msgspec.DecodeError on bad JSON."""
    first = data.lstrip()[:1]
    if first == b"[":
        return _RAW_LIST.decode(data), {}
    if first != b"{":
        _ANY.decode(data)  # raises DecodeError for non-JSON
        return None, {}
    top = _TOP.decode(data)
    events_raw = top.pop("traceEvents", None)
    header = {key: _ANY.decode(raw) for key, raw in top.items()}
    if events_raw is None:
        return None, header
    try:
        return _RAW_LIST.decode(events_raw), header
    except msgspec.ValidationError:
        return None, header


def _decode_one_by_one(chunk: list[msgspec.Raw], warnings: list[str]) -> list[Event]:
    events, skipped, recoded = [], 0, 0
    for raw in chunk:
        try:
            events.append(msgspec.json.decode(raw, type=Event))
        except (msgspec.DecodeError, msgspec.ValidationError):
            try:
                # Kineto cuts long names at a byte count, sometimes inside a UTF-8 character.
                fixed = bytes(raw).decode("utf-8", "replace").encode()
                events.append(msgspec.json.decode(fixed, type=Event))
                recoded += 1
            except (msgspec.DecodeError, msgspec.ValidationError):
                skipped += 1
    if recoded:
        warnings.append(f"replaced invalid UTF-8 bytes with U+FFFD in {recoded:,} events")
    if skipped:
        warnings.append(f"skipped {skipped:,} malformed events (not trace-event objects)")
    return events


_NONSTANDARD_NUMBER = re.compile(rb"(?<=[:\[,\s])-?(?:NaN|nan|Infinity|inf|INF)(?=[\s,\]\}])")
_CONTROL = bytes(range(32))
_CONTROL_NOT_SPACE = bytes(c for c in range(32) if c not in b"\t\n\r")


def _repair(data: bytes) -> tuple[bytes, str]:
    """Make common real-world deviations parseable: raw control bytes, NaN/Infinity, bad UTF-8.

    Returns the repaired bytes and a warning that says exactly what was changed.
    """
    controls = len(data) - len(data.translate(None, _CONTROL_NOT_SPACE))
    repaired = data.translate(bytes.maketrans(_CONTROL, b" " * 32))
    repaired, count = _NONSTANDARD_NUMBER.subn(b"null", repaired)
    done = []
    if count:
        done.append(f"read {count:,} NaN/Infinity values as null")
    if controls:
        done.append(f"replaced {controls:,} raw control characters with spaces")
    try:
        repaired.decode("utf-8")
    except UnicodeDecodeError:
        repaired = repaired.decode("utf-8", "replace").encode()
        done.append("replaced invalid UTF-8 bytes with U+FFFD")
    if not done:
        done.append("replaced raw tabs or line breaks inside strings with spaces")
    return repaired, "repaired non-standard JSON: " + "; ".join(done)


def _describe_json_error(exc: msgspec.DecodeError, data: bytes) -> str:
    text = str(exc)
    match = re.search(r"\(byte (\d+)\)", text)
    where = int(match.group(1)) if match else None
    size = len(data)
    if "truncated" in text or (where is not None and where >= size - 1 and "trailing" not in text):
        end = len(data.rstrip(b" \t\r\n\x00"))
        padding = f" (then {size - end:,} blank or zero bytes)" if size - end > 8 else ""
        events = data.count(b'"ph"')
        after = f"after about {events:,} events" if events else "before the first event"
        return (
            f"truncated JSON: the document stops at byte {end:,}{padding}, {after}; "
            "the file was cut off while being written or copied"
        )
    reason = text.split("(byte")[0].strip().removeprefix("JSON is malformed: ")
    if where is not None:
        near = data[max(0, where - 20) : where + 20].decode("utf-8", "replace")
        return f"invalid JSON at byte {where:,}: {reason} (near {near!r})"
    return f"invalid JSON ({reason})"


def _to_batch(events: list[Event]) -> pa.RecordBatch:
    no_args = Args()
    args = [e.args or no_args for e in events]
    grid = [_triple(a.grid) for a in args]
    block = [_triple(a.block) for a in args]
    cols: dict[str, pa.Array] = {
        "ph": _str_col([e.ph for e in events]),
        "cat": _str_col([e.cat for e in events]),
        "name": _str_col([e.name for e in events]),
        "pid": _str_col([e.pid for e in events]),
        "tid": _str_col([e.tid for e in events]),
        "ts_txt": _raw_col([e.ts for e in events]),
        "dur_txt": _raw_col([e.dur for e in events]),
        "device": _int_col([a.device for a in args]),
        "stream": _str_col([a.stream for a in args]),
        "correlation": _int_col([a.correlation for a in args]),
        "external_id": _int_col(
            [a.external_id if a.external_id is not None else a.external_id_old for a in args]
        ),
        "grid_x": _int_col([g[0] for g in grid]),
        "grid_y": _int_col([g[1] for g in grid]),
        "grid_z": _int_col([g[2] for g in grid]),
        "block_x": _int_col([b[0] for b in block]),
        "block_y": _int_col([b[1] for b in block]),
        "block_z": _int_col([b[2] for b in block]),
        "registers": _int_col([a.registers for a in args]),
        "shared_memory": _int_col([a.shared_memory for a in args]),
        "blocks_per_sm": _float_col([a.blocks_per_sm for a in args]),
        "warps_per_sm": _float_col([a.warps_per_sm for a in args]),
        "est_occupancy": _float_col([a.est_occupancy for a in args]),
        "bytes": _int_col([a.bytes for a in args]),
        "kind": _str_col([a.kind for a in args]),
        "sync_kind": _str_col([a.sync_kind for a in args]),
        "wait_on_stream": _int_col([a.wait_on_stream for a in args]),
        "collective": _str_col([a.collective for a in args]),
        "in_nelems": _int_col([a.in_nelems for a in args]),
        "out_nelems": _int_col([a.out_nelems for a in args]),
        "group_size": _int_col([a.group_size for a in args]),
        "dtype": _str_col([a.dtype for a in args]),
        "pg_name": _str_col([a.pg_name for a in args]),
        "pg_desc": _str_col([a.pg_desc for a in args]),
        "pg_ranks": _str_col([a.pg_ranks for a in args]),
        "seq": _int_col([a.seq if a.seq is not None else a.seq_alt for a in args]),
        "meta_name": _str_col([a.meta_name for a in args]),
    }
    return pa.RecordBatch.from_pydict(cols)


def _empty_table() -> pa.Table:
    return pa.Table.from_batches([_to_batch([])])


def _triple(value: Any) -> tuple[Any, Any, Any]:
    if isinstance(value, list) and len(value) == 3:
        return value[0], value[1], value[2]
    return None, None, None


def _str_col(values: list[Any]) -> pa.Array:
    """Text column; numbers (e.g. integer pids) are converted by Arrow, not Python."""
    try:
        return pa.array(values, type=pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    try:
        inferred = pa.array(values)
        if pa.types.is_integer(inferred.type) or pa.types.is_null(inferred.type):
            return inferred.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    return pa.array([None if v is None else _to_text(v) for v in values], type=pa.string())


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    return msgspec.json.encode(value).decode()


def _raw_col(values: list[msgspec.Raw]) -> pa.Array:
    """Exact JSON text of each number (empty string when absent)."""
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)), out=offsets[1:])
    buffer = pa.py_buffer(b"".join(values))
    kind = pa.large_string() if offsets[-1] >= (1 << 31) else pa.string()
    offsets = offsets.astype(np.int64 if kind == pa.large_string() else np.int32)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(offsets), buffer]).cast(
        pa.string()
    )


def _int_col(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([_clean_int(v) for v in values], type=pa.int64())


def _clean_int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        value = int(value)
    if isinstance(value, str):
        try:
            value = int(value.strip(), 0)
        except ValueError:
            return None
    if isinstance(value, int) and -_INT64_MAX - 1 <= value <= _INT64_MAX:
        return value
    return None


def _float_col(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values, type=pa.float64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array(
            [
                v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
                for v in values
            ],
            type=pa.float64(),
        )
