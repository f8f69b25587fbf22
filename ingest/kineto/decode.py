"""Decode Kineto (PyTorch Profiler) JSON into one flat Arrow table.

The JSON is decoded with msgspec into small typed structs, a piece of a few
MB at a time, and each piece is turned into Arrow columns straight away, so
peak memory is the file's bytes plus one piece of Python objects (the ingest
decodes from the stream instead, ``stream.py``, without the file's bytes; it
falls back to this module's whole-document path for anything unusual). Only the
fields that stallscope uses are decoded; everything else is skipped by the
parser. Well-formed documents are cut into pieces at event boundaries by a
byte search (:func:`_decode_clean`); anything else takes the careful path,
which splits the events one by one and repairs what it can. Each piece is
decoded by its events' ``ph`` first (:func:`_decode_piece`): the events no
query reads (flows, instants, counters) become two-field structs; a piece
with an event of any other ``ph`` is decoded as :class:`Event` s, with the
same result.

Numbers that carry time (``ts``, ``dur``) are read from their exact JSON text,
never through a float: plain numbers (``1712195495519689.047`` µs) become
integer nanoseconds here (``*_fast_ns``), any other spelling keeps its text
(``*_txt``) for the SQL conversion in ``canonical``.

Output contract (:class:`KinetoDecoded`): ``events`` has one row per trace
event that the canonical SQL reads (``ph`` ``X`` or ``M``) with the columns
of :data:`RAW_COLUMNS` (``meta_name`` filled on metadata rows only,
``input_dims``/``input_types`` on operator rows only, and both columns
absent when no row has them); ``gpu_args`` has one
row per GPU-activity event (the rows of ``events`` that :func:`gpu_rows`
marks, in the same order) with the launch, copy and collective args of
:data:`GPU_ARG_COLUMNS`; ``others`` keeps the name and the sign of ``dur`` of
every other event (flows, instants: 30-45 % of the events of real traces).
Keeping the args for the GPU rows alone, not as 24 null columns on every row,
and no columns for events nothing reads, makes the decoded tables about a
third of the JSON's size instead of as large. ``header`` holds the top-level
keys other than ``traceEvents`` (``deviceProperties``, ``distributedInfo``,
``schemaVersion``, ``baseTimeNanoseconds``, ...).
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter, not_
from typing import Any, Union

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from msgspec.structs import astuple

from stallscope.errors import InputError
from stallscope.ingest.kineto.pieces import LastPieceError, decode_pieces
from stallscope.ingest.startup import skip_pandas_probe

CHUNK_EVENTS = 100_000
_INT64_MAX = (1 << 63) - 1


def _f(name: str) -> Any:
    return msgspec.field(default=None, name=name)


class Args(msgspec.Struct, gc=False):
    """The ``args`` keys stallscope reads; values are loosely typed on purpose.

    In the order PyTorch writes them (operators, then kernels, copies and
    collectives): msgspec looks a key up from where the last one matched,
    so the common keys come first (~5 % less parse time).
    """

    external_id: Any = _f("External id")
    device: Any = None
    stream: Any = None
    correlation: Any = None
    registers: Any = _f("registers per thread")
    shared_memory: Any = _f("shared memory")
    blocks_per_sm: Any = _f("blocks per SM")
    warps_per_sm: Any = _f("warps per SM")
    grid: Any = None
    block: Any = None
    est_occupancy: Any = _f("est. achieved occupancy %")
    # Operator input shapes (``record_shapes=True``): kept as their JSON text, never parsed.
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    external_id_old: Any = _f("external id")
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
    input_dims_old: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input dims")


class _EventBody(msgspec.Struct, gc=False):
    """The fields the canonical SQL reads of an event, less ``ph`` (which :class:`Event` adds
    as a field and the tagged classes tell by their class)."""

    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = msgspec.Raw(b"")
    dur: msgspec.Raw = msgspec.Raw(b"")
    args: Args | None = None


class Event(_EventBody, gc=False):
    """Any event, ``ph`` read as a field (the last: ``astuple`` gives the body's fields, then
    ``ph``)."""

    ph: Any = None


class _NoArgsRead(msgspec.Struct, gc=False):
    """An ``args`` whose keys nothing reads: checked to be an object (as :class:`Args` is), no
    value decoded."""


class _ReadEvent(_EventBody, tag_field="ph", gc=False):
    """An event the canonical SQL reads (``ph`` ``X`` or ``M``, the subclasses' tags)."""


class _OtherEvent(msgspec.Struct, tag_field="ph", gc=False):
    """Any other event (flows, instants, counters...): only what ``others`` keeps. ``args`` is
    checked to be an object or null, as :class:`Event` checks it, so that the same events
    fail to decode either way."""

    name: Any = None
    dur: msgspec.Raw = msgspec.Raw(b"")
    args: _NoArgsRead | None = None


class _Complete(_ReadEvent, tag="X"):
    pass


class _Metadata(_ReadEvent, tag="M"):
    pass


# The other phases of the Trace Event Format (and Kineto's): one class each, as msgspec's
# tagged unions want. An event with any other ``ph`` (or none, or not a string) fails the
# tagged decode, and its piece is decoded with :class:`Event` instead (same result).
_OTHER_PHASES = "BEiIsftCbneSTpFPNODVvRc()"
_OTHER_CLASSES = tuple(
    type(f"_Other_{ord(ph)}", (_OtherEvent,), {}, tag=ph) for ph in _OTHER_PHASES
)
_TAGGED_LIST = msgspec.json.Decoder(list[Union[(_Complete, _Metadata, *_OTHER_CLASSES)]])  # noqa: UP007
_EVENTS_LIST = msgspec.json.Decoder(list[Event])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.json.Decoder()

RAW_COLUMNS = (
    "ph", "cat", "name", "pid", "tid", "ts_txt", "ts_fast_ns", "dur_txt", "dur_fast_ns",
    "device", "stream", "correlation", "external_id", "meta_name", "input_dims", "input_types",
)  # fmt: skip
GPU_ARG_COLUMNS = (
    "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
    "registers", "shared_memory", "blocks_per_sm", "warps_per_sm", "est_occupancy",
    "bytes", "kind", "sync_kind", "wait_on_stream",
    "collective", "in_nelems", "out_nelems", "group_size", "dtype",
    "pg_name", "pg_desc", "pg_ranks", "seq",
)  # fmt: skip


@dataclass
class KinetoDecoded:
    """A decoded trace; rows in file order in every table.

    ``events``: the events the canonical SQL reads (``ph`` ``X`` and ``M``),
    with the columns of :data:`RAW_COLUMNS`. ``gpu_args``: the launch, copy
    and collective args (:data:`GPU_ARG_COLUMNS`) of the ``events`` rows that
    :func:`gpu_rows` marks. ``others``: every other event (flows, instants,
    counters...), which no query reads: its ``name`` (names are interned from
    every event) and ``negative_dur`` (whether its ``dur`` is below 0, for the
    warning that counts them).
    """

    events: pa.Table
    gpu_args: pa.Table
    others: pa.Table
    header: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


UTF8_BOM = b"\xef\xbb\xbf"


def decode_kineto(name: str, data: bytes) -> KinetoDecoded:
    """Decode a Kineto JSON document (object with ``traceEvents`` or bare array)."""
    skip_pandas_probe()
    # Many short-lived Arrow arrays are made here; pyarrow's default pool
    # (mimalloc) keeps their pages after they are freed, the system one gives
    # them back: ~30 MB less peak memory on a 54 MB trace, no slower.
    # Every buffer remembers its pool, so switching is safe at any time.
    if data[:3] == UTF8_BOM:  # written by some Windows editors and tools: not part of the JSON
        if isinstance(data, bytearray):
            del data[:3]  # in place: no second copy of a big buffer
        else:
            data = data[3:]
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        return _decode(name, data)
    finally:
        pa.set_memory_pool(previous)


def _decode(name: str, data: bytes) -> KinetoDecoded:
    fast = _decode_clean(data)
    if fast is not None:
        return fast
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
            except msgspec.DecodeError:  # ValidationError included: find the bad entries
                events = _decode_one_by_one(chunk, warnings)
            batches.append(_to_batch(events))
            del events
    finally:
        if was_enabled:
            gc.enable()
    decoded = _decoded(batches, header)
    if raws and decoded.events.num_rows + decoded.others.num_rows == 0:
        raise InputError(
            name,
            f"not a Kineto trace: none of the {len(raws):,} traceEvents entries is an event object",
        )
    decoded.warnings = warnings
    return decoded


def _decode_clean(data: bytes) -> KinetoDecoded | None:
    """Fast path for well-formed documents; None sends the caller down the careful path.

    The ``traceEvents`` text is cut into pieces of about CHUNK_BYTES at event
    boundaries found by a byte search (no per-event split) and each piece is
    decoded straight into structs. A cut in the wrong place (inside a string
    or a nested value) leaves an unterminated string or container, so that
    piece fails to decode and the whole document takes the careful path, as
    does anything malformed. Peak memory: the document plus one piece's objects.
    """
    start, end = _strip_bounds(data)
    first = data[start : start + 1]
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if first == b"[":
            body = memoryview(data)[start:end]
            header: dict[str, Any] = {}
        elif first == b"{":
            found = _split_by_search(data)
            if found is not None:
                try:  # the last piece first: a wrong end fails there, cheaply
                    batches = decode_pieces(found[1], _decode_piece, last_first=True)
                    return _decoded(batches, found[0])
                except LastPieceError:
                    pass  # maybe the search was fooled: let msgspec find the array
                # (a bad piece elsewhere is bad whoever found the array: careful path)
            top = _TOP.decode(data)
            raw = top.pop("traceEvents", None)
            if raw is None:
                return None
            header = {key: _ANY.decode(value) for key, value in top.items()}
            body = memoryview(raw)
        else:
            return None
        if bytes(body[:1]) != b"[" or bytes(body[-1:]) != b"]":
            return None
        batches = decode_pieces(body, _decode_piece)
    except msgspec.DecodeError:  # ValidationError included
        return None
    finally:
        if was_enabled:
            gc.enable()
    return _decoded(batches, header)


def empty_decoded() -> KinetoDecoded:
    """No events: the tables' columns and types alone."""
    return _decoded([], {})


def _decoded(batches: list[Batches], header: dict[str, Any]) -> KinetoDecoded:
    """One table of events and one of GPU args from the pieces' batches, in order."""
    batches = batches or [_to_batch([])]
    return KinetoDecoded(
        events=_without_empty_shapes(pa.Table.from_batches([events for events, _, _ in batches])),
        gpu_args=pa.Table.from_batches([gpu for _, gpu, _ in batches]),
        others=pa.Table.from_batches([others for _, _, others in batches]),
        header=header,
        warnings=[],
    )


SHAPE_COLUMNS = ("input_dims", "input_types")


def _without_empty_shapes(events: pa.Table) -> pa.Table:
    """``events`` less :data:`SHAPE_COLUMNS` when no row has input shapes (no ``record_shapes``).

    Null string columns still hold an offsets buffer: ~24 MB for the two on
    3 M events, at the ingest's peak. ``canonical`` reads absent ones as null.
    """
    if any(events[column].null_count < events.num_rows for column in SHAPE_COLUMNS):
        return events
    return events.drop_columns(list(SHAPE_COLUMNS))


_EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')


def _split_by_search(data: bytes) -> tuple[dict[str, Any], memoryview] | None:
    """(header, ``traceEvents`` array) found by byte search, without parsing the array.

    The array is taken to run from the first ``"traceEvents": [`` to the
    document's last ``]``; the rest (``{... "traceEvents": [] ...}``) must then
    parse as an object whose ``traceEvents`` is that empty array, else None.
    Where the array is not the document's last container (a key after it holds
    a list), the body found ends inside that list: the caller's decoding of the
    last piece fails on it and msgspec then finds the array (``_TOP``). Saves
    parsing the whole document twice: ~0.3 s on 500 MB.
    """
    match = _EVENTS_KEY.search(data)
    end = data.rfind(b"]")
    if match is None or end < match.end() - 1:
        return None
    start = match.end() - 1
    try:
        top = _TOP.decode(b"".join((data[:start], b"[]", data[end + 1 :])))
    except msgspec.DecodeError:
        return None
    events = top.pop("traceEvents", None)
    if events is None or bytes(events) != b"[]":
        return None
    header = {key: _ANY.decode(value) for key, value in top.items()}
    return header, memoryview(data)[start : end + 1]


def _decode_piece(piece: bytes) -> Batches:
    """One piece ``[e1, e2, ...]`` -> its batches (see :func:`_to_batch`).

    Decoded first by ``ph`` into the events the SQL reads (every field) and the
    others (their name, ``dur`` and the type of ``args`` alone: less to build
    and free for 30-45 % of the events); a piece with an event of another
    ``ph`` (or none) is decoded as :class:`Event` s instead, with the same
    result. Raises ``msgspec.DecodeError`` (validation errors included) as
    ``_EVENTS_LIST.decode`` would.
    """
    # A piece without the text '"Input ' holds no input shapes: skip reading them (a byte search).
    shapes = b'"Input ' in piece
    try:
        events = _TAGGED_LIST.decode(piece)
    except msgspec.ValidationError:
        return _to_batch(_EVENTS_LIST.decode(piece), shapes=shapes)
    return _tagged_to_batch(events, shapes)


def _strip_bounds(data: bytes) -> tuple[int, int]:
    """Start and end of ``data`` without JSON whitespace around it (no copy)."""
    start, end = 0, len(data)
    while start < end and data[start] in b" \t\r\n":
        start += 1
    while end > start and data[end - 1] in b" \t\r\n":
        end -= 1
    return start, end


_ASCII_BLANKS = re.compile(rb"[ \t\n\r\x0b\x0c]*")  # what bytes.lstrip() strips, found not copied


def _split_top(data: bytes) -> tuple[list[msgspec.Raw] | None, dict[str, Any]]:
    """Top level -> (raw events, header). Raises msgspec.DecodeError on bad JSON."""
    start = _ASCII_BLANKS.match(data).end()
    first = data[start : start + 1]
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


_NO_ARGS = Args()


Batches = tuple[pa.RecordBatch, pa.RecordBatch, pa.RecordBatch]


def _to_batch(events: list[Event], shapes: bool = True) -> Batches:
    """(events, GPU args, other events) batches of one piece (see :class:`KinetoDecoded`).

    Column by column over a few hundred thousand structs is the cost here, so
    the structs are turned into columns by ``astuple`` and ``zip`` (C loops,
    no Python code per value), events that no canonical query reads (``ph``
    other than ``X`` and ``M``: flows, instants, counters) keep only their
    name and the sign of their ``dur``, the launch, copy and collective args
    are read from the GPU-category rows only, ``meta_name`` from metadata rows,
    and the input shapes from operator rows. ``shapes=False`` (the caller knows
    no event has input shapes) leaves ``input_dims``/``input_types`` null
    without reading them.
    """
    phases = _str_col([e.ph for e in events])
    read = pc.is_in(phases, value_set=pa.array(READ_PHASES, pa.string())).fill_null(False)
    others = _other_events(_Rows(pc.invert(read), len(events)).pick(events))
    if others.num_rows:
        events = _Rows(read, len(events)).pick(events)
    if not events:
        fields: tuple[Sequence[Any], ...] = ((),) * 8
    else:
        fields = tuple(zip(*map(astuple, events), strict=True))
    ph = phases if not others.num_rows else _str_col(fields[-1])
    return (*_read_batches(ph, fields[:-1], shapes), others)


_READ_CLASSES = (_Complete, _Metadata)


def _tagged_to_batch(events: list[Any], shapes: bool) -> Batches:
    """:func:`_to_batch` of a piece decoded by ``ph`` (``_TAGGED_LIST``): the same batches."""
    kinds = list(map(type, events))
    read = [kind in _READ_CLASSES for kind in kinds]
    if all(read):
        rows, others = events, []
    else:
        rows = list(compress(events, read))
        others = list(compress(events, map(not_, read)))
        kinds = list(compress(kinds, read))
    if kinds.count(_Complete) == len(kinds):
        ph = pa.array(["X"] * len(kinds), pa.string())
    else:
        ph = pa.array(["X" if kind is _Complete else "M" for kind in kinds], pa.string())
    # One list per field (comprehensions: faster here than astuple and zip, no tuple per event).
    fields = (
        [e.cat for e in rows],
        [e.name for e in rows],
        [e.pid for e in rows],
        [e.tid for e in rows],
        [e.ts for e in rows],
        [e.dur for e in rows],
        [e.args for e in rows],
    )
    return (*_read_batches(ph, fields, shapes), _other_events(others))


def _read_batches(
    ph: pa.Array, fields: tuple[Sequence[Any], ...], shapes: bool
) -> tuple[pa.RecordBatch, pa.RecordBatch]:
    """(events, GPU args) batches of the rows the SQL reads, from their ``ph`` column and
    their other fields (``cat, name, pid, tid, ts, dur, args``), one sequence each."""
    cat, name, pid, tid, ts, dur, args = fields
    n = len(ph)
    filled = [a or _NO_ARGS for a in args]
    device = [a.device for a in filled]
    stream = [a.stream for a in filled]
    correlation = [a.correlation for a in filled]
    external_id = [a.external_id for a in filled]
    cat = _str_col(cat)
    gpu = _gpu_columns(_Rows(gpu_rows(cat), n).pick(filled))
    meta_rows = _Rows(pc.equal(ph, "M"), n)
    cols: dict[str, pa.Array] = {
        "ph": ph,
        "cat": cat,
        "name": _str_col(name),
        "pid": _str_col(pid),
        "tid": _str_col(tid),
        **_times("ts", ts),
        **_times("dur", dur),
        "device": _int_col(device),
        "stream": _str_col(stream),
        "correlation": _int_col(correlation),
        "external_id": _int_col(_either(external_id, lambda: [a.external_id_old for a in filled])),
        "meta_name": meta_rows.spread(_str_col([a.meta_name for a in meta_rows.pick(filled)])),
        **(_shapes(filled, cat) if shapes else _no_shapes(n)),
    }
    return pa.RecordBatch.from_pydict(cols), pa.RecordBatch.from_pydict(gpu)


# The phases the canonical SQL reads (complete events, metadata); see KinetoDecoded.
# (A tuple: an Arrow array made from a list at import would make pyarrow import
# pandas before skip_pandas_probe can stop it.)
READ_PHASES = ("X", "M")


def _other_events(others: list[Any]) -> pa.RecordBatch:
    """The events no query reads (:class:`Event` s or ``_OtherEvent`` s): their name and
    whether their ``dur`` is negative."""
    dur = _times("dur", [e.dur for e in others])
    negative = pc.or_(
        pc.less(dur["dur_fast_ns"], 0).fill_null(False),
        pc.starts_with(pc.utf8_trim_whitespace(dur["dur_txt"]), "-").fill_null(False),
    )
    return pa.RecordBatch.from_pydict(
        {"name": _str_col([e.name for e in others]), "negative_dur": negative}
    )


_ARG_FIELDS = Args.__struct_fields__


def _gpu_columns(gpu_args: list[Args]) -> dict[str, pa.Array]:
    """The launch, copy and collective args of GPU-activity rows, as Arrow columns."""
    if gpu_args:
        fields = dict(zip(_ARG_FIELDS, zip(*map(astuple, gpu_args), strict=True), strict=True))
    else:
        fields = {key: () for key in _ARG_FIELDS}
    grid = _triples(fields["grid"])
    block = _triples(fields["block"])
    return {
        "grid_x": grid[0],
        "grid_y": grid[1],
        "grid_z": grid[2],
        "block_x": block[0],
        "block_y": block[1],
        "block_z": block[2],
        "registers": _int_col(fields["registers"]),
        "shared_memory": _int_col(fields["shared_memory"]),
        "blocks_per_sm": _float_col(fields["blocks_per_sm"]),
        "warps_per_sm": _float_col(fields["warps_per_sm"]),
        "est_occupancy": _float_col(fields["est_occupancy"]),
        "bytes": _int_col(fields["bytes"]),
        "kind": _str_col(fields["kind"]),
        "sync_kind": _str_col(fields["sync_kind"]),
        "wait_on_stream": _int_col(fields["wait_on_stream"]),
        "collective": _str_col(fields["collective"]),
        "in_nelems": _int_col(fields["in_nelems"]),
        "out_nelems": _int_col(fields["out_nelems"]),
        "group_size": _int_col(fields["group_size"]),
        "dtype": _str_col(fields["dtype"]),
        "pg_name": _str_col(fields["pg_name"]),
        "pg_desc": _str_col(fields["pg_desc"]),
        "pg_ranks": _str_col(fields["pg_ranks"]),
        "seq": _int_col(_either(fields["seq"], lambda: fields["seq_alt"])),
    }


def _triples(values: Sequence[Any]) -> tuple[pa.Array, pa.Array, pa.Array]:
    """``[x, y, z]`` lists -> three int64 columns (``_int_col`` of each element); else nulls.

    Lists of integers (what PyTorch writes) are taken apart by Arrow; any
    other value makes every row go through :func:`_triple` as before.
    """
    try:
        lists = pa.array(values, type=pa.list_(pa.int64()))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        split = [_triple(v) for v in values]
        return tuple(_int_col([t[k] for t in split]) for k in range(3))  # type: ignore[return-value]
    three = pc.equal(pc.list_value_length(lists), 3)
    lists = pc.if_else(three, lists, pa.scalar(None, lists.type))
    return tuple(pc.list_element(lists, k) for k in range(3))  # type: ignore[return-value]


def _shapes(args: list[Args], cat: pa.Array) -> dict[str, pa.Array]:
    """``input_dims`` and ``input_types`` of the operator rows: the JSON text of ``Input Dims``
    (or the older ``Input dims``) and ``Input type``, null elsewhere and where absent.

    Without ``record_shapes`` no operator has them: that costs one attribute read
    per operator row and an empty join, then all-null columns.
    """
    rows = _Rows(_op_mask(cat), len(args))
    ops = rows.pick(args)
    dims = list(map(_DIMS, ops))
    if not any(map(len, dims)):
        dims = list(map(_DIMS_OLD, ops))
        if not any(map(len, dims)):
            return _no_shapes(len(args))
    else:
        old = list(map(_DIMS_OLD, ops))
        if any(map(len, old)):
            dims = [d if len(d) else o for d, o in zip(dims, old, strict=True)]
    return {
        "input_dims": rows.spread(_json_or_null(dims)),
        "input_types": rows.spread(_json_or_null(list(map(_TYPES, ops)))),
    }


def _no_shapes(n: int) -> dict[str, pa.Array]:
    return {"input_dims": pa.nulls(n, pa.string()), "input_types": pa.nulls(n, pa.string())}


_DIMS = attrgetter("input_dims")
_DIMS_OLD = attrgetter("input_dims_old")
_TYPES = attrgetter("input_types")


def _op_mask(cat: pa.Array) -> pa.Array:
    """Rows whose category is an operator (``cpu_op``, 2021's ``Operator``), or non-ASCII."""
    lowered = pc.is_in(pc.ascii_lower(cat), value_set=pa.array(["cpu_op", "operator"]))
    return pc.or_(lowered, pc.invert(pc.string_is_ascii(cat))).fill_null(False)


def _json_or_null(values: list[msgspec.Raw]) -> pa.Array:
    """Raw JSON values as text, null where absent (empty) or JSON ``null``."""
    text = raw_text(values)
    if not len(text) or text.buffers()[2] is None or not text.buffers()[2].size:
        return pa.nulls(len(values), pa.string())
    absent = pc.or_(pc.equal(pc.binary_length(text), 0), pc.equal(text, "null"))
    return pc.if_else(absent, pa.scalar(None, pa.string()), text)


# Lower-cased categories whose rows read the GPU-only args (canonical.GPU_KINDS).
_GPU_CATS = np.array(["kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "cuda_sync"])


def gpu_rows(cat: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Rows whose category lower-cases to a GPU kind (non-ASCII ones too, to be safe).

    The rows of ``KinetoDecoded.gpu_args``: ``events.filter(gpu_rows(events["cat"]))``
    lines up with it row for row.
    """
    lowered = pc.is_in(pc.ascii_lower(cat), value_set=pa.array(_GPU_CATS, pa.string()))
    return pc.or_(lowered, pc.invert(pc.string_is_ascii(cat))).fill_null(False)


class _Rows:
    """A subset of a batch's rows: pick Python values, spread Arrow values back."""

    def __init__(self, mask: pa.Array, n: int):
        self.n = n
        self.index = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
        self.all = len(self.index) == n
        self.positions = None
        if not self.all and len(self.index):
            positions = np.full(n, len(self.index), dtype=np.int64)
            positions[self.index] = np.arange(len(self.index))
            self.positions = pa.array(positions)

    def pick(self, values: list[Any]) -> list[Any]:
        return values if self.all else [values[i] for i in self.index.tolist()]

    def spread(self, subset: pa.Array) -> pa.Array:
        """Subset values at their rows, null elsewhere."""
        if self.all:
            return subset
        if self.positions is None:
            return pa.nulls(self.n, subset.type)
        return pa.concat_arrays([subset, pa.nulls(1, subset.type)]).take(self.positions)


def _either(first: list[Any], second: Callable[[], list[Any]]) -> list[Any]:
    """``first`` with its Nones filled from ``second`` (built only when needed)."""
    if first.count(None) == 0:
        return first
    other = second()
    if other.count(None) == len(other):
        return first
    return [a if a is not None else b for a, b in zip(first, other, strict=True)]


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
    # Mixed types (e.g. integer tids beside a "Spans" label): _to_text, with
    # its common cases inlined (str(int) is repr(int); bool is not int here).
    return pa.array(
        [
            v if v is None or (t := type(v)) is str else str(v) if t is int else _to_text(v)
            for v in values
        ],
        type=pa.string(),
    )


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    return msgspec.json.encode(value).decode()


def raw_text(values: list[msgspec.Raw]) -> pa.Array:
    """Exact JSON text of each raw value (a number, a shapes list; empty string when absent)."""
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)), out=offsets[1:])
    buffer = pa.py_buffer(b"".join(values))
    kind = pa.large_string() if offsets[-1] >= (1 << 31) else pa.string()
    offsets = offsets.astype(np.int64 if kind == pa.large_string() else np.int32)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(offsets), buffer]).cast(
        pa.string()
    )


def _times(prefix: str, values: list[msgspec.Raw]) -> dict[str, pa.Array]:
    """``<prefix>_fast_ns`` where the text is a plain number, else ``<prefix>_txt``."""
    text = raw_text(values)
    fast = plain_ns(text)
    if fast.null_count == 0:
        text = pa.nulls(len(text), pa.string())
    elif fast.null_count < len(fast):
        text = pc.if_else(fast.is_null(), text, pa.scalar(None, pa.string()))
    return {f"{prefix}_txt": text, f"{prefix}_fast_ns": fast}


_POW10 = 10 ** np.arange(4, dtype=np.uint64)
_INT64_LIMIT = np.uint64(_INT64_MAX)


def plain_ns(text: pa.Array) -> pa.Array:
    """µs text -> int64 ns for plain numbers (``123``, ``123.4``, ``123.456``), else null.

    Exact integer arithmetic, vectorised across strings one character position
    at a time (Horner's rule). Other spellings (signs, exponents, 4+ decimals,
    quotes, empty) stay null here and are converted in SQL
    (``canonical._ns_sql``) as before.
    """
    n = len(text)
    _, offsets_buf, data_buf = text.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1, offset=text.offset * 4)
    start = offsets[:-1].astype(np.int64)
    length = np.diff(offsets)
    if n == 0 or offsets[-1] == offsets[0]:
        return pa.nulls(n, pa.int64())
    data = np.frombuffer(data_buf, dtype=np.uint8, count=int(offsets[-1]))
    last = len(data) - 1
    value = np.zeros(n, dtype=np.uint64)
    digits = np.zeros(n, dtype=np.int8)
    decimals = np.zeros(n, dtype=np.int8)
    dots = np.zeros(n, dtype=np.int8)
    bad = (length == 0) | (length > 20)  # 16 digits, a dot and 3 decimals at most
    for j in range(min(int(length.max()), 20)):
        live = length > j
        char = data[np.minimum(start + j, last)]
        is_digit = live & (char >= 48) & (char <= 57)
        is_dot = live & (char == 46)
        bad |= live & ~is_digit & ~is_dot
        value = np.where(is_digit, value * 10 + (char - 48), value)
        digits += is_digit
        decimals += is_digit & (dots > 0)
        dots += is_dot
    int_digits = digits - decimals
    bad |= (dots > 1) | (int_digits < 1) | (int_digits > 16) | (decimals > 3)
    bad |= (dots == 1) & (decimals == 0)
    ns = value * _POW10[np.clip(3 - decimals, 0, 3)]
    bad |= ns > _INT64_LIMIT
    return pa.array(ns.astype(np.int64), mask=bad)


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
