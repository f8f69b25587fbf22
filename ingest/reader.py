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
import itertools
import os
import stat
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from stallscope.errors import InputError
from stallscope.ingest.limits import (
    RATIO_CAP,
    check_deadline,
    decompressed_cap,
    max_ranks,
    memory_limit_text,
    ratio_cap,
)

GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
_CHUNK = 1 << 20
STREAM_BLOCK = 4 << 20  # decompressed bytes per block of Source.stream()
_HASH_BLOCK = 16 << 20
_SKIP_NAMES = {".DS_Store", "Thumbs.db"}
# Files that sit beside traces in a job folder or zip and are never traces:
# notes, logs, scripts, images, and stallscope's own ground-truth sidecars.
# They are skipped by name (never read) and named in the job's warnings;
# other non-traces are told apart by content (stallscope.ingest.sniff.not_a_trace).
_SKIP_SUFFIXES = (
    ".truth.json",
    ".md",
    ".txt",
    ".log",
    ".py",
    ".sh",
    ".yaml",
    ".yml",
    ".toml",
    ".png",
    ".jpg",
    ".jpeg",
)
MAX_ZIP_MEMBERS = 4096


def max_trace_bytes() -> int:
    """Largest decompressed trace accepted, in bytes (env STALLSCOPE_MAX_TRACE_BYTES)."""
    raw = os.environ.get("STALLSCOPE_MAX_TRACE_BYTES", "")
    try:
        value = int(raw) if raw else 16 << 30
    except ValueError:
        return 16 << 30
    return value if value > 0 else 16 << 30


def _limit_reason(limit: int) -> str:
    return (
        f"the {_fmt_bytes(limit)} limit for one trace (set STALLSCOPE_MAX_TRACE_BYTES to raise it)"
    )


@dataclass
class Skipped:
    """A file inside a directory or zip that is not a trace: left out of the job, named in a warning."""

    name: str  # as Source.name: what users see
    short: str  # its path inside the directory or zip
    reason: str


@dataclass
class Expanded:
    """One user argument: its job name, trace candidates and (directories, zips) skipped files."""

    name: str
    sources: list[Source]
    skipped: list[Skipped]
    container: str  # "directory" or "zip archive" (its non-traces are skipped), "" for a file


@dataclass
class Source:
    """One input file (or zip member) of a job.

    ``name`` is what users see in messages; ``file_bytes`` is the size as
    stored (compressed); ``file_hash`` the SHA-256 hex digest of those
    stored bytes (what ``sha256sum`` prints), used for de-duplication.
    """

    name: str
    loader: Callable[[], bytes]
    file_bytes: int
    path: Path | None = None  # plain files: hashed by streaming, without keeping the bytes
    streamer: Callable[[], Iterator[bytes]] | None = None  # zip members: hashed the same way
    member: str | None = None  # its path inside the directory or zip it came from
    stored_size: int | None = None  # zip members: the member's size once unzipped (gzip's cap)
    _raw: bytes | None = None
    _hash: str | None = None

    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = self.loader()
        return self._raw

    def head(self, size: int) -> bytes:
        """The first ``size`` stored bytes, without loading (or keeping) the whole file."""
        if self._raw is not None:
            return bytes(self._raw[:size])
        if self.streamer is not None:
            out = bytearray()
            stream = self.streamer()
            try:
                for chunk in stream:
                    out += chunk
                    if len(out) >= size:
                        break
            finally:
                stream.close()
            return bytes(out[:size])
        if self.path is not None:
            try:
                with open(self.path, "rb") as fh:
                    return fh.read(size)
            except OSError as exc:
                raise InputError(self.name, f"cannot read file ({exc.strerror or exc})") from None
        return bytes(self.raw()[:size])

    @property
    def file_hash(self) -> str:
        """SHA-256 of the stored bytes: from memory once loaded, else streamed from the file.

        SHA-256 rather than BLAKE2b: with the CPU's SHA instructions it is about
        twice as fast here (0.27 vs 0.52 s for 486 MB).
        """
        if self._hash is None:
            digest = hashlib.sha256()
            if self._raw is None and self.streamer is not None:
                for chunk in self.streamer():
                    digest.update(chunk)
            elif self._raw is None and self.path is not None:
                self.raw_size_check()
                try:
                    with open(self.path, "rb") as fh:
                        while chunk := fh.read(_CHUNK):
                            digest.update(chunk)
                except OSError as exc:
                    raise InputError(
                        self.name, f"cannot read file ({exc.strerror or exc})"
                    ) from None
            else:
                digest.update(self.raw())
            self._hash = digest.hexdigest()
        return self._hash

    def load_hashed(self) -> None:
        """Read the stored bytes and hash them in one pass: ``raw()`` and ``file_hash`` then cost nothing.

        A plain file is read block by block into one buffer while a thread
        hashes each block already read (file reads and SHA-256 both run
        without the GIL): about the time of the read alone, where reading then
        hashing took both (0.27 + 0.27 s for 486 MB). The buffer is a
        ``bytearray``; parsers only read it.
        """
        if self._raw is not None or self._hash is not None or self.path is None:
            self.raw()
            return
        self.raw_size_check()
        digest = hashlib.sha256()
        try:
            with open(self.path, "rb", buffering=0) as fh, ThreadPoolExecutor(1) as hasher:
                buf = bytearray(self.file_bytes)
                view = memoryview(buf)
                done = 0
                while done < len(buf) and (n := fh.readinto(view[done : done + _HASH_BLOCK])):
                    hasher.submit(digest.update, view[done : done + n])
                    done += n
                hasher.shutdown(wait=True)
                view.release()
                del buf[done:]  # the file shrank since it was listed
                while more := fh.read(_HASH_BLOCK):  # ... or grew
                    digest.update(more)
                    buf += more
        except OSError as exc:
            raise InputError(self.name, f"cannot read file ({exc.strerror or exc})") from None
        self._raw, self._hash = buf, digest.hexdigest()

    def raw_size_check(self) -> None:
        """Refuse a plain file too large to be a trace before reading it."""
        limit = max_trace_bytes()
        if self.file_bytes > limit + limit // 1000 + 1024:
            raise InputError(self.name, f"file is larger than {_limit_reason(limit)}")

    def read(self) -> bytes:
        """Decompressed contents; raises InputError on corrupt or oversized data."""
        data = self.raw()
        if not data:
            raise InputError(self.name, "empty file")
        if data[:2] == GZIP_MAGIC:
            return gunzip_limited(self.name, data)
        if len(data) > max_trace_bytes():
            raise InputError(self.name, f"file is larger than {_limit_reason(max_trace_bytes())}")
        return data

    def release(self) -> None:
        """Drop the cached raw bytes (call once the trace is parsed)."""
        self._raw = None

    def stream(self) -> Iterator[bytes]:
        """:meth:`read`'s bytes block by block (at most :data:`STREAM_BLOCK` each), without
        holding the whole file: read from the file (or the zip member, or the loaded bytes)
        and inflated as they come when gzip. The same checks and one-line errors as
        :meth:`read`, raised when the block that breaks them is reached (a truncated gzip:
        at the end). Each call starts again from the beginning.
        """
        stored = self._stored_blocks()
        try:
            first = next(stored, b"")
            if not first:
                raise InputError(self.name, "empty file")
            blocks = itertools.chain((first,), stored)
            if first[:2] == GZIP_MAGIC:
                yield from gunzip_blocks(self.name, blocks, self._stored_length())
                return
            limit, total = max_trace_bytes(), 0
            for block in blocks:
                total += len(block)
                if total > limit:
                    raise InputError(self.name, f"file is larger than {_limit_reason(limit)}")
                yield block
        finally:
            stored.close()

    def decompressed_size_hint(self) -> int:
        """About how many bytes :meth:`stream` yields, read without inflating anything: the
        file's size when plain, gzip's stored size of its last member (modulo 4 GiB) when
        gzip; a guess (for choosing how to decode), never a limit."""
        stored = self._stored_length()
        head = self.head(2)
        if head != GZIP_MAGIC:
            return stored
        try:
            if self._raw is not None:
                tail = bytes(self._raw[-4:])
            elif self.path is not None:
                with open(self.path, "rb") as fh:
                    fh.seek(max(0, stored - 4))
                    tail = fh.read(4)
            else:
                return stored * 10
        except OSError:
            return stored
        size = int.from_bytes(tail, "little") if len(tail) == 4 else 0
        return size if size >= stored else stored * 10

    def _stored_length(self) -> int:
        if self._raw is not None:
            return len(self._raw)
        return self.stored_size if self.stored_size is not None else self.file_bytes

    def _stored_blocks(
        self, block: int = STREAM_BLOCK, *, size_check: bool = True
    ) -> Iterator[bytes]:
        """The stored bytes in blocks of up to ``block`` bytes (zip members: as unzipped; a
        stream's blocks as it gives them), without loading the whole file. ``size_check``: a
        file over the stored-size limit raises InputError before anything is read."""
        if self._raw is not None:
            raw = self._raw
            for start in range(0, len(raw), block):
                yield bytes(raw[start : start + block])
            return
        if self.streamer is not None:
            stream = self.streamer()
            try:
                yield from stream
            finally:
                stream.close()
            return
        if self.path is None:
            yield self.raw()
            return
        if size_check:
            self.raw_size_check()
        try:
            with open(self.path, "rb") as fh:
                while data := fh.read(block):
                    yield data
        except OSError as exc:
            raise InputError(self.name, f"cannot read file ({exc.strerror or exc})") from None


def decompressed_head(source: Source, size: int) -> bytes | None:
    """The first ``size`` bytes of a source's decompressed contents, reading only what that needs.

    Plain files are read in 64 KiB blocks and zip members streamed (their caps
    apply); a gzip file is inflated up to ``size`` output bytes, so a bomb
    costs at most ``size``. ``None`` when the head cannot be decoded (a corrupt
    gzip header, an unreadable member): the full read then says why.
    """
    chunks = source._stored_blocks(1 << 16, size_check=False)
    try:
        first = next(chunks, b"")
        if first[:2] != GZIP_MAGIC:
            out = bytearray(first[:size])
            for chunk in chunks:
                if len(out) >= size:
                    break
                out += chunk[: size - len(out)]
            return bytes(out)
        return _gunzip_head(first, chunks, size)
    except (InputError, zlib.error):
        return None
    finally:
        chunks.close()


def _gunzip_head(first: bytes, rest: Iterator[bytes], size: int) -> bytes:
    """Inflate gzip data (maybe several members) until ``size`` bytes come out or the input ends."""
    out = bytearray()
    dec = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    pending = first
    while len(out) < size:
        if not pending:
            pending = next(rest, b"")
            if not pending:
                break  # truncated (or done): the head is what there is
        out += dec.decompress(pending, size - len(out))
        pending = dec.unconsumed_tail
        if dec.eof:
            pending = dec.unused_data
            if pending[:2] != GZIP_MAGIC:
                break
            dec = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    return bytes(out)


def gunzip_limited(name: str, data: bytes) -> bytearray:
    """Decompress gzip data (possibly several members) into one buffer, refusing bombs.

    The output may not pass :func:`~stallscope.ingest.limits.decompressed_cap`
    of the compressed size (a ratio cap plus a headroom, within the largest
    trace accepted): decompression stops as soon as it does, so a bomb costs at
    most that much memory. The buffer is returned as is (no second copy).
    """
    cap = decompressed_cap(len(data), max_trace_bytes())
    out = bytearray()
    pos = 0
    view = memoryview(data)
    while pos < len(data):
        if data[pos : pos + 2] != GZIP_MAGIC:
            if not data[pos:].strip(b"\x00"):
                break  # zero padding after the last member
            raise InputError(
                name,
                f"corrupt gzip file (unexpected bytes after the compressed data, at byte {pos:,})",
            )
        dec = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        chunk_in = view[pos:]
        try:
            while True:
                piece = dec.decompress(chunk_in, _CHUNK)
                out += piece
                chunk_in = dec.unconsumed_tail
                _check_size(name, len(out), len(data), cap)
                if dec.eof or (not piece and not chunk_in):
                    break
        except zlib.error as exc:
            raise InputError(name, _describe_zlib_error(exc)) from None
        if not dec.eof:
            raise InputError(name, "truncated gzip file (the compressed stream ends early)")
        pos = len(data) - len(dec.unused_data)
        check_deadline(name)
    view.release()
    return out


def gunzip_blocks(name: str, blocks: Iterator[bytes], compressed: int) -> Iterator[bytes]:
    """:func:`gunzip_limited` block by block: the same members, caps and errors, for
    ``compressed`` stored bytes arriving as ``blocks``; yields the inflated bytes."""
    cap = decompressed_cap(compressed, max_trace_bytes())
    produced = position = 0  # bytes inflated; stored offset of ``pending``
    pending = b""
    while True:
        while len(pending) < 2 and (block := next(blocks, None)) is not None:
            pending = bytes(pending) + block
        if not pending:
            return
        if pending[:2] != GZIP_MAGIC:
            if bytes(pending).strip(b"\x00") or any(block.strip(b"\x00") for block in blocks):
                raise InputError(
                    name,
                    "corrupt gzip file (unexpected bytes after the compressed data,"
                    f" at byte {position:,})",
                )
            return  # zero padding after the last member
        dec = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        while True:
            if not pending:
                pending = next(blocks, b"")
                if not pending:
                    break
            try:
                out = dec.decompress(pending, STREAM_BLOCK)
            except zlib.error as exc:
                raise InputError(name, _describe_zlib_error(exc)) from None
            rest = dec.unused_data if dec.eof else dec.unconsumed_tail
            position += len(pending) - len(rest)
            pending = rest
            produced += len(out)
            _check_size(name, produced, compressed, cap)
            if out:
                yield out
            if dec.eof:
                break
        if not dec.eof:
            raise InputError(name, "truncated gzip file (the compressed stream ends early)")
        check_deadline(name)


def _describe_zlib_error(exc: zlib.error) -> str:
    text = str(exc).split(": ", 1)[-1]  # drop "Error -3 while decompressing data: "
    if "incorrect data check" in text or "incorrect length check" in text:
        return "corrupt gzip file (checksum mismatch: the data is damaged)"
    if "incorrect header check" in text or "unknown compression method" in text:
        return f"corrupt gzip file (bad header: {text})"
    return f"corrupt gzip file ({text})"


def _check_size(name: str, produced: int, compressed: int, cap: int) -> None:
    """Refuse output past ``cap`` (:func:`decompressed_cap` of ``compressed``)."""
    if produced <= cap:
        return
    limit = max_trace_bytes()
    if cap >= limit:
        raise InputError(name, f"decompresses to more than {_limit_reason(limit)}")
    if cap < ratio_cap(compressed):  # the memory limit, not the ratio, bound it
        raise InputError(
            name, f"decompresses to more than {_fmt_bytes(cap)}, a third of {memory_limit_text()}"
        )
    raise InputError(
        name,
        f"{_fmt_bytes(compressed)} expands to more than {_fmt_bytes(cap)} "
        f"(over {RATIO_CAP}x its size plus {_fmt_bytes(cap - RATIO_CAP * compressed)}): "
        "a decompression bomb, not a trace (STALLSCOPE_DECOMPRESS_HEADROOM_MB raises the headroom)",
    )


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _file_source(path: Path, display: str) -> Source:
    try:
        st = path.stat()
    except OSError as exc:
        raise InputError(display, f"cannot read file ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(display, "not a regular file (a device, pipe or socket)")
    size = st.st_size

    def load() -> bytes:
        # A gzip file is never more than a hair larger than what it expands
        # to (headers, 5 bytes per stored 64 KiB block), so this refuses
        # huge files before reading them.
        limit = max_trace_bytes()
        if size > limit + limit // 1000 + 1024:
            raise InputError(display, f"file is larger than {_limit_reason(limit)}")
        try:
            return path.read_bytes()
        except OSError as exc:
            raise InputError(display, f"cannot read file ({exc.strerror or exc})") from None

    return Source(name=display, loader=load, file_bytes=size, path=path)


def zip_sources(path: Path, display: str) -> tuple[list[Source], list[Skipped]]:
    """Members of a zip archive that may be traces, and those skipped by name (notes, images...).

    Members are read only when used, one at a time. The caller tells traces
    from other files by content and checks the rank count.
    """
    limit = max_trace_bytes()
    try:
        zf = zipfile.ZipFile(path)
        infos = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as exc:
        raise InputError(display, f"corrupt zip archive ({exc})") from None
    if len(infos) > MAX_ZIP_MEMBERS:
        raise InputError(
            display,
            f"zip archive holds {len(infos):,} entries (more than {MAX_ZIP_MEMBERS:,}): "
            "not an archive of traces",
        )
    for info in infos:
        if _unsafe_member_name(info.filename):
            raise InputError(
                display,
                f"zip archive has an unsafe member path {info.filename!r} "
                "(absolute or with '..'): refusing a hostile archive",
            )
    files = [i for i in infos if not i.is_dir() and not _junk(i.filename)]
    if not files:
        raise InputError(display, "zip archive holds no files")
    skipped = [
        Skipped(f"{display}:{i.filename}", i.filename, reason)
        for i in files
        if (reason := _skip_by_name(i.filename))
    ]
    members = [i for i in files if not _skip_by_name(i.filename)]
    total = sum(i.file_size for i in members)
    if total > limit:
        raise InputError(display, f"zip archive expands to more than {_limit_reason(limit)}")
    sources = []
    for info in members:
        member = f"{display}:{info.filename}"
        if info.flag_bits & 0x1:
            raise InputError(member, "encrypted zip member (unpack it with its password first)")
        cap = decompressed_cap(info.compress_size, limit)
        if info.file_size > cap:
            raise InputError(
                member,
                f"{_fmt_bytes(info.compress_size)} expanding to {_fmt_bytes(info.file_size)} "
                f"(over {RATIO_CAP}x its size plus a headroom): a zip bomb, not a trace",
            )
        sources.append(_zip_member_source(zf, info, member, cap))
    return sources, skipped


def _zip_member_source(zf: zipfile.ZipFile, info: zipfile.ZipInfo, member: str, cap: int) -> Source:
    """A zip member read only when parsed (one member in memory at a time), hashed by streaming."""

    def stream() -> Iterator[bytes]:
        produced = 0
        try:
            with zf.open(info) as fh:
                while chunk := fh.read(_CHUNK):
                    produced += len(chunk)
                    if produced > cap:
                        raise InputError(
                            member,
                            f"zip member expands past {_fmt_bytes(cap)} "
                            "(more than its header says): a zip bomb, not a trace",
                        )
                    yield chunk
        except (zipfile.BadZipFile, OSError, zlib.error, EOFError) as exc:
            raise InputError(member, f"corrupt zip member ({exc})") from None
        except (NotImplementedError, RuntimeError) as exc:
            raise InputError(member, f"unsupported zip member ({exc})") from None

    def load() -> bytes:
        out = bytearray()
        for chunk in stream():
            out += chunk
        return out

    return Source(
        name=member,
        loader=load,
        file_bytes=info.compress_size,
        streamer=stream,
        member=info.filename,
        stored_size=info.file_size,
    )


def _check_rank_count(name: str, count: int, what: str) -> None:
    if count > max_ranks():
        raise InputError(
            name,
            f"{what} holds {count:,} trace files, more than the {max_ranks():,} ranks one job may "
            "hold (STALLSCOPE_MAX_RANKS raises it)",
        )


def _unsafe_member_name(name: str) -> bool:
    """A member path that would escape the folder it is unpacked into."""
    norm = name.replace("\\", "/")
    return (
        norm.startswith("/")
        or (len(norm) > 1 and norm[1] == ":")  # C:/...
        or "\x00" in norm
        or ".." in norm.split("/")
    )


def _junk(name: str) -> bool:
    """Files an operating system or archiver leaves behind: ignored without a word."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    return not base or base.startswith(".") or base in _SKIP_NAMES or "__MACOSX" in name


def _skip_by_name(name: str) -> str | None:
    """Why a file is not a trace, from its name alone (notes, logs, scripts, images), else None."""
    base = name.rsplit("/", 1)[-1].lower()
    suffix = next((s for s in _SKIP_SUFFIXES if base.endswith(s)), None)
    return f"a {suffix} file, not a trace" if suffix else None


def directory_sources(path: Path) -> tuple[list[Source], list[Skipped]]:
    """Files inside (or below) a directory that may be traces, and those skipped by name."""
    try:
        files = sorted(p for p in path.rglob("*") if p.is_file() and not _junk(p.name))
    except OSError as exc:
        raise InputError(str(path), f"cannot read directory ({exc.strerror or exc})") from None
    if not files:
        raise InputError(str(path), "directory holds no files")
    if len(files) > MAX_ZIP_MEMBERS:  # each file's head is read to tell traces apart: bound it
        raise InputError(
            str(path),
            f"directory holds {len(files):,} files (more than {MAX_ZIP_MEMBERS:,}): "
            "not the folder of one job",
        )
    skipped = [
        Skipped(str(p), p.relative_to(path).as_posix(), reason)
        for p in files
        if (reason := _skip_by_name(p.name))
    ]
    sources = []
    for p in files:
        if not _skip_by_name(p.name):
            sources.append(_file_source(p, str(p)))
            sources[-1].member = p.relative_to(path).as_posix()
    return sources, skipped


def check_rank_count(name: str, count: int, what: str) -> None:
    """Refuse a directory or zip with more trace files than one job may hold."""
    _check_rank_count(name, count, what)


def expand(arg: str) -> Expanded:
    """One user argument -> its job name, sources and skipped files. Directories and zips are one job each."""
    path = Path(arg)
    if not path.exists():
        if path.is_symlink():
            raise InputError(arg, "broken symbolic link (its target does not exist)")
        raise InputError(arg, "no such file or directory")
    if path.is_dir():
        return Expanded(path.name or str(path), *directory_sources(path), container="directory")
    if not path.is_file():
        raise InputError(arg, "not a regular file (a device, pipe or socket)")
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise InputError(arg, f"cannot read file ({exc.strerror or exc})") from None
    if head == ZIP_MAGIC:
        return Expanded(path.stem, *zip_sources(path, arg), container="zip archive")
    return Expanded(path.name, [_file_source(path, arg)], [], container="")


def expand_path(arg: str) -> tuple[str, list[Source]]:
    """One user argument -> (job name, its trace candidates); see :func:`expand`."""
    expanded = expand(arg)
    return expanded.name, expanded.sources


def iter_sources(args: Iterable[str]) -> Iterable[tuple[str, list[Source]]]:
    for arg in args:
        yield expand_path(arg)
