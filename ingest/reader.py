"""Read trace files safely: plain, gzip, zip members and directories.

Everything that can go wrong with the bytes themselves (missing file, empty
file, truncated or corrupt gzip, a decompression bomb, a hostile zip) becomes
an :class:`~stallscope.errors.InputError` with one line of explanation.

Contract: :func:`expand_paths` turns user arguments into :class:`Source`
objects; ``Source.read()`` returns the decompressed bytes (never more than
:func:`max_trace_bytes`).
"""

from __future__ import annotations

import hashlib
import os
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from stallscope.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
_CHUNK = 1 << 20
# A real Kineto trace compresses 5-30x; JSON made of one repeated event
# compresses ~100-300x. Past this ratio (and past 64 MiB of output) we call it
# a decompression bomb.
MAX_COMPRESSION_RATIO = 1000
_RATIO_FLOOR = 64 << 20
_SKIP_NAMES = {".DS_Store", "Thumbs.db"}


def max_trace_bytes() -> int:
    """Largest decompressed trace accepted, in bytes (env STALLSCOPE_MAX_TRACE_BYTES)."""
    raw = os.environ.get("STALLSCOPE_MAX_TRACE_BYTES", "")
    try:
        return int(raw) if raw else 16 << 30
    except ValueError:
        return 16 << 30


@dataclass
class Source:
    """One input file (or zip member) of a job.

    ``name`` is what users see in messages; ``file_bytes`` is the size as
    stored (compressed); ``file_hash`` the BLAKE2b-128 hex digest of those
    stored bytes, used for de-duplication.
    """

    name: str
    loader: Callable[[], bytes]
    file_bytes: int
    _raw: bytes | None = None
    _hash: str | None = None

    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = self.loader()
        return self._raw

    @property
    def file_hash(self) -> str:
        if self._hash is None:
            self._hash = hashlib.blake2b(self.raw(), digest_size=16).hexdigest()
        return self._hash

    def read(self) -> bytes:
        """Decompressed contents; raises InputError on corrupt or oversized data."""
        data = self.raw()
        if not data:
            raise InputError(self.name, "empty file")
        if data[:2] == GZIP_MAGIC:
            return gunzip_limited(self.name, data)
        if len(data) > max_trace_bytes():
            raise InputError(
                self.name, f"file is larger than the {_fmt_bytes(max_trace_bytes())} limit"
            )
        return data

    def release(self) -> None:
        """Drop the cached raw bytes (call once the trace is parsed)."""
        self._raw = None


def gunzip_limited(name: str, data: bytes) -> bytes:
    """Decompress gzip data (possibly several members), refusing bombs."""
    limit = max_trace_bytes()
    out = bytearray()
    pos = 0
    view = memoryview(data)
    while pos < len(data):
        if data[pos : pos + 2] != GZIP_MAGIC:
            if data[pos:].strip(b"\x00") == b"":
                break  # zero padding after the last member
            raise InputError(name, "corrupt gzip data (garbage after a gzip member)")
        dec = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        chunk_in = view[pos:]
        try:
            while True:
                piece = dec.decompress(chunk_in, _CHUNK)
                out += piece
                _check_size(name, len(out), len(data), limit)
                chunk_in = dec.unconsumed_tail
                if dec.eof or (not piece and not chunk_in):
                    break
        except zlib.error as exc:
            raise InputError(name, f"corrupt gzip data ({exc})") from None
        if not dec.eof:
            raise InputError(name, "truncated gzip file (the compressed stream ends early)")
        pos = len(data) - len(dec.unused_data)
    return bytes(out)


def _check_size(name: str, produced: int, compressed: int, limit: int) -> None:
    if produced > limit:
        raise InputError(
            name,
            f"decompresses to more than {_fmt_bytes(limit)} (limit; set STALLSCOPE_MAX_TRACE_BYTES to raise it)",
        )
    if produced > _RATIO_FLOOR and produced > MAX_COMPRESSION_RATIO * compressed:
        raise InputError(
            name,
            f"compression ratio above {MAX_COMPRESSION_RATIO}:1 (a decompression bomb, not a trace)",
        )


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _file_source(path: Path, display: str) -> Source:
    def load() -> bytes:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise InputError(display, f"cannot read file ({exc.strerror or exc})") from None

    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(display, f"cannot read file ({exc.strerror or exc})") from None
    return Source(name=display, loader=load, file_bytes=size)


def zip_sources(path: Path, display: str) -> list[Source]:
    """Members of a zip archive that look like trace files, largest first."""
    limit = max_trace_bytes()
    try:
        zf = zipfile.ZipFile(path)
        infos = zf.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(display, f"corrupt zip archive ({exc})") from None
    members = [i for i in infos if not i.is_dir() and _wanted_member(i.filename)]
    if not members:
        raise InputError(display, "zip archive holds no trace files")
    if len(members) > 4096:
        raise InputError(display, f"zip archive holds {len(members)} files (more than 4096)")
    total = sum(i.file_size for i in members)
    if total > limit:
        raise InputError(display, f"zip archive expands to more than {_fmt_bytes(limit)}")
    sources = []
    for info in members:
        if (
            info.compress_size
            and info.file_size > _RATIO_FLOOR
            and info.file_size > MAX_COMPRESSION_RATIO * info.compress_size
        ):
            raise InputError(
                f"{display}:{info.filename}", "compression ratio too high (a zip bomb)"
            )

        def load(info=info) -> bytes:
            try:
                with zf.open(info) as fh:
                    data = fh.read(limit + 1)
            except (zipfile.BadZipFile, OSError, zlib.error, EOFError) as exc:
                raise InputError(
                    f"{display}:{info.filename}", f"corrupt zip member ({exc})"
                ) from None
            if len(data) > limit:
                raise InputError(
                    f"{display}:{info.filename}", "zip member is larger than the limit"
                )
            return data

        sources.append(
            Source(name=f"{display}:{info.filename}", loader=load, file_bytes=info.compress_size)
        )
    return sources


def _wanted_member(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return bool(base) and not base.startswith(".") and base not in _SKIP_NAMES and "__MACOSX" not in name


def directory_sources(path: Path) -> list[Source]:
    """Trace-like files directly inside (or below) a directory, sorted by name."""
    files = sorted(p for p in path.rglob("*") if p.is_file() and _wanted_member(p.name))
    if not files:
        raise InputError(str(path), "directory holds no files")
    return [_file_source(p, str(p)) for p in files]


def expand_path(arg: str) -> tuple[str, list[Source]]:
    """One user argument -> (job name, its sources). Directories and zips are one job each."""
    path = Path(arg)
    if not path.exists():
        raise InputError(arg, "no such file or directory")
    if path.is_dir():
        return path.name or str(path), directory_sources(path)
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head == ZIP_MAGIC:
        return path.stem, zip_sources(path, arg)
    return path.name, [_file_source(path, arg)]


def iter_sources(args: Iterable[str]) -> Iterable[tuple[str, list[Source]]]:
    for arg in args:
        yield expand_path(arg)
