"""Tell what a file is from its first bytes, before any expensive parsing.

:func:`sniff` returns ``"kineto"`` for a file worth handing to the Kineto
parser, or raises :class:`InputError` with a specific reason (a PNG, an nsys
report that needs exporting, a PyTorch memory timeline, an Execution Trace...).
"""

from __future__ import annotations

import re

from stallscope.errors import InputError

_MAGIC = (
    (b"\x89PNG", "PNG image, not a trace"),
    (b"\xff\xd8\xff", "JPEG image, not a trace"),
    (b"GIF8", "GIF image, not a trace"),
    (b"%PDF", "PDF document, not a trace"),
    (b"PK\x03\x04", "nested zip archive (unpack it first)"),
    (b"BZh", "bzip2 data (decompress it first, or use gzip)"),
    (b"\xfd7zXZ", "xz data (decompress it first, or use gzip)"),
    (b"\x28\xb5\x2f\xfd", "zstd data (decompress it first, or use gzip)"),
    (b"\x7fELF", "executable file, not a trace"),
)
_SQLITE = b"SQLite format 3\x00"
_NSYS_HINT = "export it with: nsys export --type sqlite -o {stem}.sqlite {name}"


def sniff(name: str, data: bytes) -> str:
    """Format of decompressed ``data``: currently only ``"kineto"`` is accepted."""
    head = data[:4096]
    for magic, reason in _MAGIC:
        if head.startswith(magic):
            raise InputError(name, reason)
    if head.startswith(_SQLITE):
        raise InputError(
            name,
            "SQLite database (Nsight Systems export): nsys ingest is not available in this version",
        )
    lower = name.lower()
    if lower.endswith((".nsys-rep", ".qdrep")):
        stem = re.sub(r"\.(nsys-rep|qdrep)$", "", name.rsplit("/", 1)[-1], flags=re.I)
        raise InputError(
            name,
            "Nsight Systems report: " + _NSYS_HINT.format(stem=stem, name=name.rsplit("/", 1)[-1]),
        )
    if lower.endswith(".ncu-rep"):
        raise InputError(
            name, "Nsight Compute report: Nsight Compute ingest is not available in this version"
        )
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text:
        raise InputError(name, "empty file" if not data.strip() else "no JSON content")
    if b"\x00" in head[:512]:
        raise InputError(name, "binary data, not a JSON trace")
    if text[:1] == b"[":
        return _sniff_array(name, text)
    if text[:1] == b"{":
        return _sniff_object(name, data)
    if lower.endswith(".csv") or b"," in text.split(b"\n", 1)[0]:
        raise InputError(
            name, "CSV file: Nsight Compute CSV ingest is not available in this version"
        )
    raise InputError(name, "not JSON: not a PyTorch profiler (Kineto) trace")


def _sniff_array(name: str, text: bytes) -> str:
    inner = text[1:].lstrip()
    if inner[:1] == b"[":
        raise InputError(name, "PyTorch memory-timeline export, not a trace")
    if inner[:1] in (b"{", b"]"):
        return "kineto"
    raise InputError(name, "JSON array of non-objects: not a Kineto trace")


def _sniff_object(name: str, data: bytes) -> str:
    # The distinguishing keys sit near the top in every producer we know;
    # a full parse later gives the definitive answer.
    head = data[: 1 << 16]
    if b'"traceEvents"' in head or b'"schemaVersion"' in head or b'"deviceProperties"' in head:
        return "kineto"
    if b'"nodes"' in head and (b'"schema"' in head or b'"pid"' in head):
        raise InputError(
            name,
            "PyTorch Execution Trace (ET), not a Kineto trace: ingest the matching profiler trace",
        )
    if b'"rocprofiler-sdk-tool"' in head or b'"rocprofiler' in head:
        raise InputError(
            name, "rocprofv3 JSON, not a Kineto trace: use the PyTorch profiler's trace instead"
        )
    # traceEvents may follow a large metadata block: let the parser decide.
    return "kineto"
