"""PyTorch profiler (Kineto) JSON traces: how they are recognised, and their registration.

``parse.py`` reads one file (one rank): ``stream.py`` decodes it block by block
as it is read and decompressed (the ingest never holds the whole file),
``decode.py`` (with ``pieces.py`` for parallel decoding) turns a JSON document
held whole into an Arrow table of raw events (``stream.py``'s fallback),
``canonical.py`` turns those into the canonical tables in SQL; other tables
(e.g. allocator events) are read by the module of this folder that declares
their ``TABLE_READER``. Formats: docs/schema.md.
"""

from __future__ import annotations

import re

from stallscope.errors import InputError
from stallscope.ingest.formats import Format, ParseContext, ParsedTrace, Payload
from stallscope.ingest.reader import Source

_WHITESPACE = (b" ", b"\t", b"\r", b"\n")
_BOM = b"\xef\xbb\xbf"
_BLANKS = re.compile(rb"[ \t\r\n]*")
_OBJECT_HEAD = 1 << 16  # where the distinguishing keys of a JSON object are looked for


def looks_like_kineto(name: str, data: bytes) -> bool:
    """A JSON object or array of objects: worth handing to the Kineto parser (which gives the
    definitive answer). JSON that is known to be something else is refused here.

    Reads a few KiB after the leading blanks, found by a match, never by a stripped copy
    of the whole file (which was a second copy of the trace at the ingest's peak)."""
    start = _BLANKS.match(data, len(_BOM) if data.startswith(_BOM) else 0).end()
    text = data[start : start + 4096]
    if text[:1] == b"[":
        return _array(name, text)
    if text[:1] == b"{":
        return _object(name, data[start : start + _OBJECT_HEAD])
    return False


def _array(name: str, text: bytes) -> bool:
    inner = text[1:].lstrip()
    if inner[:1] == b"[":
        raise InputError(name, "PyTorch memory-timeline export, not a trace")
    if inner[:1] in (b"{", b"]"):
        return True
    if not inner:
        return True  # a huge run of whitespace: let the parser decide
    raise InputError(name, "JSON array of non-objects: not a Kineto trace")


def _object(name: str, data: bytes) -> bool:
    # The distinguishing keys sit near the top in every producer we know;
    # a full parse later gives the definitive answer.
    head = data[:_OBJECT_HEAD]
    if b'"traceEvents"' in head or b'"schemaVersion"' in head or b'"deviceProperties"' in head:
        return True
    if b'"nodes"' in head and (b'"schema"' in head or b'"pid"' in head):
        raise InputError(
            name,
            "PyTorch Execution Trace (ET), not a Kineto trace: ingest the matching profiler trace",
        )
    if b'"rocprofiler-sdk-tool"' in head or b'"rocprofiler' in head:
        raise InputError(
            name, "rocprofv3 JSON, not a Kineto trace: use the PyTorch profiler's trace instead"
        )
    if b'"segments"' in head and b'"device_traces"' in head:
        raise InputError(name, "PyTorch CUDA memory snapshot, not a profiler trace")
    return True  # traceEvents may follow a large metadata block: let the parser decide


def _parse(source: Source, payload: Payload, ctx: ParseContext) -> list[ParsedTrace]:
    from stallscope.ingest.kineto.parse import parse_kineto

    if payload.blocks is not None:
        return parse_kineto(source, payload, ctx)
    return parse_kineto(source, payload.take(), ctx)


FORMAT = Format(
    name="kineto",
    title="PyTorch profiler (Kineto) JSON",
    detect=looks_like_kineto,
    parse=_parse,
    provides=frozenset({"timeline"}),
    priority=100,  # last: it claims any JSON object or array that nothing else did
    extensions=("json",),
    streams=True,
)
