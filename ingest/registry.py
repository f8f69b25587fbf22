"""The input formats stallscope reads, found in ``ingest/``, in the order they are tried.

Every package under ``ingest/`` (``ingest/<format>/``) is a format: its
``__init__.py`` declares ``FORMAT`` (or ``FORMATS``, a tuple: one folder,
several formats, e.g. Nsight Systems' report and export), each a
:class:`~stallscope.ingest.formats.Format` whose ``priority`` places it in
the order formats are tried. A new format is one folder: no list to edit
here. The tables it fills are declared in :mod:`stallscope.schema`
(tests/test_schema.py checks the two agree). A package that declares no
Format, or two formats of one priority or name, is an error here, not skipped.
"""

from __future__ import annotations

import importlib
import pkgutil
import zlib
from pathlib import Path

from stallscope.ingest.formats import Format
from stallscope.ingest.reader import GZIP_MAGIC, Source


def format_packages() -> list[str]:
    """The format folders of ``ingest/``, by name (sorted; no import)."""
    return sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.ispkg)


def _declared(package: str) -> tuple[Format, ...]:
    module = importlib.import_module(f"{__package__}.{package}")
    found = getattr(module, "FORMATS", None) or (getattr(module, "FORMAT", None),)
    if not found or not all(isinstance(f, Format) for f in found):
        raise RuntimeError(f"ingest/{package}/__init__.py declares no FORMAT = Format(...)")
    return tuple(found)


def _discover(by_package: dict[str, tuple[Format, ...]]) -> tuple[Format, ...]:
    """Every declared format, by ``priority`` (binary ones first: a header tells them; Kineto
    last, as it claims any JSON object or array that nothing else did)."""
    formats = [f for package in sorted(by_package) for f in by_package[package]]
    for attr in ("priority", "name"):
        seen: dict[object, str] = {}
        for fmt in formats:
            value = getattr(fmt, attr)
            if value in seen:
                raise RuntimeError(f"formats {seen[value]} and {fmt.name} share {attr} {value!r}")
            seen[value] = fmt.name
    return tuple(sorted(formats, key=lambda f: f.priority))


# format folder (``ingest/<name>/``) -> the formats it declares
BY_PACKAGE: dict[str, tuple[Format, ...]] = {p: _declared(p) for p in format_packages()}
FORMATS: tuple[Format, ...] = _discover(BY_PACKAGE)
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
