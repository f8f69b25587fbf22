"""The input formats stallscope reads, in the order they are tried (see :class:`~stallscope.ingest.formats.Format`).

A new format is one folder under ``ingest/`` whose ``__init__.py`` declares
its ``Format``, plus one line here; the tables it fills are declared in
:mod:`stallscope.schema` (tests/test_schema.py checks the two agree).
"""

from __future__ import annotations

import zlib

from stallscope.ingest import kineto, memory_snapshot, ncu, nsys
from stallscope.ingest.formats import Format
from stallscope.ingest.reader import GZIP_MAGIC, Source

# Binary formats first (a header tells them), then text formats; Kineto last, as it
# claims any JSON object or array that nothing else did.
FORMATS: tuple[Format, ...] = (nsys.REPORT, nsys.EXPORT, ncu.FORMAT, memory_snapshot.FORMAT,
                               kineto.FORMAT)  # fmt: skip
BY_NAME: dict[str, Format] = {f.name: f for f in FORMATS}


def upload_extensions() -> list[str]:
    """File name endings to offer in a file picker: compressed and zipped files, then each
    format's (``Format.extensions``)."""
    endings = ["gz", "zip"] + [e for f in FORMATS for e in f.extensions]
    return list(dict.fromkeys(endings))


def of_source(source: str | None) -> Format | None:
    """The format whose traces carry this catalog ``source`` (``nsys``: the SQLite export's)."""
    found = [f for f in FORMATS if f.source == source]
    return found[-1] if found else None


def provides(source: str | None, what: str) -> bool:
    """Whether traces of this catalog ``source`` can provide ``what`` (a ``PROVIDES`` entry)."""
    fmt = of_source(source)
    return fmt is not None and what in fmt.provides


def is_companion(source: str | None) -> bool:
    """Whether traces of this catalog ``source`` describe another trace's kernels (not a rank)."""
    fmt = of_source(source)
    return fmt is not None and fmt.companion


def companion_file(source: Source) -> bool:
    """Whether a job's file is of a companion format, from its first 64 KiB (a gzip file: only
    its start is inflated; a zip member or file is not loaded whole just for this)."""
    head = source.head(1 << 16)
    if head[:2] == GZIP_MAGIC:
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 1 << 16)
        except zlib.error:
            return False
    return any(f.companion and f.detect(source.name, head) for f in FORMATS)
