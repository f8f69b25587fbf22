"""Tell what a file is from its first bytes, before any expensive parsing.

:func:`sniff` returns ``"kineto"`` for a file worth handing to the Kineto
parser, or raises :class:`InputError` with a specific reason (a PNG, an nsys
report that needs exporting, a PyTorch memory timeline, an Execution Trace...).
"""

from __future__ import annotations

import os
import re
import shlex

from stallscope.errors import InputError

_MAGIC = (
    (b"\x89PNG", "PNG image, not a trace"),
    (b"\xff\xd8\xff", "JPEG image, not a trace"),
    (b"GIF8", "GIF image, not a trace"),
    (b"%PDF", "PDF document, not a trace"),
    (b"PK\x03\x04", "nested zip archive (unpack it first)"),
    (b"\x1f\x8b", "gzip data inside gzip (compressed twice: gunzip it once first)"),
    (b"BZh", "bzip2 data (decompress it first, or use gzip)"),
    (b"\xfd7zXZ", "xz data (decompress it first, or use gzip)"),
    (b"\x28\xb5\x2f\xfd", "zstd data (decompress it first, or use gzip)"),
    (b"7z\xbc\xaf\x27\x1c", "7-Zip archive (unpack it first)"),
    (b"\x7fELF", "executable file, not a trace"),
)
_SQLITE = b"SQLite format 3\x00"
# Table names only an Nsight Systems export has (its schema is near the start).
_NSYS_TABLES = (b"StringIds", b"CUPTI_ACTIVITY_KIND", b"TARGET_INFO", b"META_DATA_EXPORT",
                b"EXPORT_META_DATA", b"NVTX_EVENTS")  # fmt: skip
_NSYS_REPORT = b"NVIDIA Tegra Profiler Report"  # header of every .nsys-rep and .qdrep
_NSYS_EXT = re.compile(r"\.(nsys-rep|qdrep)$", re.IGNORECASE)
_SQLITE_EXT = re.compile(r"\.(sqlite|sqlite3|db)(\.gz)?$", re.IGNORECASE)
_NCU_CSV = b'"ID","Process ID","Process Name","Host Name","Kernel Name"'
_WHITESPACE = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*")


def sniff(name: str, data: bytes) -> str:
    """Format of decompressed ``data``: ``"kineto"``, ``"ncu"`` (Nsight Compute CSV or report),
    ``"nsys"`` or ``"memory-snapshot"`` (a pickle: a CUDA memory snapshot, or refused by its parser)."""
    head = data[:4096]
    for magic, reason in _MAGIC:
        if head.startswith(magic):
            raise InputError(name, reason)
    if head.startswith(_SQLITE):
        # Nsight Systems exports can be large; its table names sit in the first pages.
        if any(table in data[: 1 << 20] for table in _NSYS_TABLES):
            return "nsys"  # ingest/nsys/parse.py checks the tables for real
        raise InputError(name, "SQLite database, not a trace")
    if head.startswith(_NSYS_REPORT) or _NSYS_EXT.search(name):
        raise InputError(name, _nsys_report_reason(name))
    if name.lower().endswith(".ncu-rep") or head.startswith((b"NVIDIA Nsight Compute", b"NVR\x00")):
        return "ncu"  # ingest/ncu/parse.py exports it with ncu, or says how to
    if head[:1] == b"\x80" and head[1:2] in b"\x02\x03\x04\x05":
        return "memory-snapshot"  # ingest/memory_snapshot/parse.py reads plain values only, or refuses
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InputError(name, "UTF-16 text: save the trace as UTF-8 JSON")
    start = _WHITESPACE.match(data).end()
    text = data[start : start + 4096]
    if not text:
        return _empty(name, data)
    if _looks_binary(text):
        if _SQLITE_EXT.search(name):
            raise InputError(
                name, "not an SQLite database (no SQLite header), so not an Nsight Systems export"
            )
        raise InputError(name, "binary data, not a JSON trace")
    first = text[:1]
    line = text.split(b"\n", 1)[0]
    if line.startswith(_NCU_CSV) or (text.startswith(b"==PROF==") and b"\n" + _NCU_CSV in text):
        return "ncu"  # Nsight Compute CSV (--page raw or details), maybe after ncu's log lines
    if first not in b"[{<" and (b'","' in line or (first != b'"' and b"," in line)):
        raise InputError(name, _csv_reason(line))
    if first == b"[":
        return _sniff_array(name, text)
    if first == b"{":
        return _sniff_object(name, data[start:])
    if first == b'"':
        raise InputError(name, "a JSON string, not a Kineto trace (expected an object)")
    if first in b"-0123456789" or text.startswith((b"true", b"false", b"null")):
        raise InputError(name, "a single JSON value, not a Kineto trace (expected an object)")
    if first == b"<":
        raise InputError(name, "HTML or XML document, not a trace")
    raise InputError(name, "not JSON: not a PyTorch profiler (Kineto) trace")


def _empty(name: str, data: bytes) -> str:
    if not data:
        raise InputError(name, "empty file")
    raise InputError(name, "empty file (only whitespace)")


def _looks_binary(text: bytes) -> bool:
    sample = text[:512]
    if b"\x00" in sample:
        return True
    controls = sum(1 for b in sample if b < 0x20 and b not in (0x09, 0x0A, 0x0C, 0x0D))
    if controls * 20 > len(sample):
        return True
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(sample) - 4:  # (a multibyte character cut at the end is fine)
            # Not UTF-8: text in another encoding has a few high bytes, binary many.
            return sum(1 for b in sample if b >= 0x80) * 4 > len(sample)
    return False


def _nsys_report_reason(name: str) -> str:
    """Why an nsys report reached :func:`sniff` (``detect_format`` hands reports to
    ``ingest/nsys/export.py`` first): stallscope reads its SQLite export."""
    path = name if os.path.isfile(name) else name.rsplit(":", 1)[-1].rsplit("/", 1)[-1]
    stem = _NSYS_EXT.sub("", path) if _NSYS_EXT.search(path) else path
    command = f"nsys export --type sqlite -o {shlex.quote(stem + '.sqlite')} {shlex.quote(path)}"
    return f"Nsight Systems report: stallscope reads its SQLite export (make it with: {command})"


def _csv_reason(line: bytes) -> str:
    if b"(ns)" in line or b"Time (%)" in line:
        return (
            "Nsight Systems 'nsys stats' CSV report, not a trace: ingest the report's SQLite "
            "export instead (nsys export --type sqlite)"
        )
    return "CSV file, not a PyTorch profiler (Kineto) trace"


def _sniff_array(name: str, text: bytes) -> str:
    inner = text[1:].lstrip()
    if inner[:1] == b"[":
        raise InputError(name, "PyTorch memory-timeline export, not a trace")
    if inner[:1] in (b"{", b"]"):
        return "kineto"
    if not inner:
        return "kineto"  # a huge run of whitespace: let the parser decide
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
    if b'"segments"' in head and b'"device_traces"' in head:
        raise InputError(name, "PyTorch CUDA memory snapshot, not a profiler trace")
    # traceEvents may follow a large metadata block: let the parser decide.
    return "kineto"
