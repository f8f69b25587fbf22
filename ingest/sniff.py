"""Tell what a file is from its first bytes, before any expensive parsing.

:func:`sniff` names the format (:data:`stallscope.ingest.registry.FORMATS`)
whose ``detect`` claims the file, or raises :class:`InputError` with a
specific reason (a PNG, a file compressed twice, a CSV that is not Nsight
Compute's, a PyTorch Execution Trace...). What is not a trace at all is
refused here; what looks like one format but is not is refused by that
format's ``detect``. :func:`not_a_trace` tells the traces of a folder or zip
from the files beside them.
"""

from __future__ import annotations

import re

from stallscope.errors import InputError
from stallscope.ingest.reader import Source, decompressed_head

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
_SQLITE_EXT = re.compile(r"\.(sqlite|sqlite3|db)(\.gz)?$", re.IGNORECASE)
_WHITESPACE = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*")


def sniff(name: str, data: bytes) -> str:
    """The name of the format of decompressed ``data`` (a key of ``registry.BY_NAME``).

    Refusals by magic number first; then the binary formats (told by a
    header: nsys reports and exports, ncu, memory snapshots); then, once the
    file is known to be UTF-8 text, the text formats (Kineto JSON); then why
    nothing claimed it.
    """
    from stallscope.ingest.registry import FORMATS

    head = data[:4096]
    for magic, reason in _MAGIC:
        if head.startswith(magic):
            raise InputError(name, reason)
    for fmt in FORMATS:
        if fmt.binary and fmt.detect(name, data):
            return fmt.name
    if head.startswith(_SQLITE):
        raise InputError(name, "SQLite database, not a trace")
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
    for fmt in FORMATS:
        if not fmt.binary and fmt.detect(name, data):
            return fmt.name
    return _unclaimed(name, text)


def _unclaimed(name: str, text: bytes) -> str:
    """Why UTF-8 text that no format claimed is not a trace (always raises)."""
    first = text[:1]
    line = text.split(b"\n", 1)[0]
    if first not in b"[{<" and (b'","' in line or (first != b'"' and b"," in line)):
        raise InputError(name, _csv_reason(line))
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


def _csv_reason(line: bytes) -> str:
    if b"(ns)" in line or b"Time (%)" in line:
        return (
            "Nsight Systems 'nsys stats' CSV report, not a trace: ingest the report's SQLite "
            "export instead (nsys export --type sqlite)"
        )
    return "CSV file, not a PyTorch profiler (Kineto) trace"


# How much of a file's decompressed head tells whether it is a trace: sniff
# looks at the first MiB at most (Nsight Systems table names in an SQLite file).
SNIFF_HEAD_BYTES = 1 << 20
# One of these sits in the first 64 KiB of every JSON trace we know.
_TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"',
               b'"displayTimeUnit"', b'"ph"')  # fmt: skip
_JSON_KEYS_HEAD = 1 << 16
# A JSON head is told from its first 64 KiB after the leading blanks (kineto's detect, the
# trace keys above): a file that starts like JSON within its first 4 KiB is sniffed from
# this much, not a MiB (a folder of 1,000 small ranks: 1,000 MiB less to inflate).
JSON_HEAD_BYTES = 4096 + (1 << 16) + 4096
_JSON_START = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]{0,4096}[\[{]")


def json_decides(head: bytes) -> bool:
    """Whether ``head`` (:data:`JSON_HEAD_BYTES` of a longer file) gives :func:`not_a_trace`
    the answer the first :data:`SNIFF_HEAD_BYTES` would: it starts as a JSON object or array.

    Every check that such a head meets reads at most its first 4 KiB of blanks, then
    64 KiB and 4 KiB: the magic numbers and binary formats' headers (none starts with
    ``{`` or ``[``), ``looks_like_kineto`` and the trace keys.
    """
    return _JSON_START.match(head) is not None


# Refusals about how a file is packed, not what it is (empty, compressed twice, another
# archive, UTF-16): it may well be a rank's trace, so it refuses the job, never skipped.
_PACKING = ("empty file", "compressed twice", "decompress it first", "unpack it first", "UTF-16")


def not_a_trace(source: Source) -> str | None:
    """Why a file inside a directory or zip is not a trace, from its content; ``None`` when it is one.

    Reads only the decompressed head (:data:`SNIFF_HEAD_BYTES`). Not a trace:
    what :func:`sniff` refuses (an image, a CSV, an empty file...), and
    JSON with none of a trace's keys in its first 64 KiB (a run's
    ``meta.json``). A trace that is broken further on (truncated, corrupt) is a
    trace here: its parse refuses the job; so is a file packed in a way that
    hides what it is (empty, compressed twice, a nested archive, UTF-16), and
    a head that cannot be decoded at all: the full read says why.
    """
    head = decompressed_head(source, JSON_HEAD_BYTES)
    if head is not None and len(head) == JSON_HEAD_BYTES and not json_decides(head):
        head = decompressed_head(source, SNIFF_HEAD_BYTES)
    if head is None:
        return None
    try:
        fmt = sniff(source.name, head)
    except InputError as exc:
        return None if any(word in exc.reason for word in _PACKING) else exc.reason
    if fmt == "kineto" and not any(key in head[:_JSON_KEYS_HEAD] for key in _TRACE_KEYS):
        return "JSON without any trace keys (traceEvents, schemaVersion, ph...), not a trace"
    return None
