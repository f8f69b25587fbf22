"""Decode a Kineto trace from its decompressed blocks, never holding the whole document.

``decode.py`` decodes a document held whole; this module gives the same
result (:class:`~stallscope.ingest.kineto.decode.KinetoDecoded` and the
``[memory]`` rows) from ``Source.stream()``'s blocks, so that the ingest's
peak is the decoded tables plus a few pieces, not the file's bytes as well:

* the top-level keys before ``"traceEvents": [`` (found by a byte search, as
  ``decode._split_by_search`` does) are kept as text; those after the array
  are what follows its last ``]``; both are parsed together as the header
  (``{...prefix... "traceEvents": [] ...suffix...}`` must be a JSON object
  whose ``traceEvents`` is that empty list), so header keys may come before or
  after the events;
* the events are cut into pieces of about ``pieces.CHUNK_BYTES`` at event
  boundaries (``pieces._BOUNDARY``) in a rolling buffer, each piece decoded
  into Arrow batches (in worker processes where ``pieces.decode_workers``
  says so) and fed to each further-table reader's ``pieces`` accumulator
  (``formats.TableReader``; the ``[memory]`` events: ``memory.MemoryRows``), then
  its bytes let go.

Anything else, a bare document with no ``traceEvents`` key, a piece that does
not decode (malformed JSON, a cut inside a string, a list after the array that
fooled the search), a header that does not parse, takes the whole-document
path of ``decode.py``: the blocks are read again into one buffer (the stream's
size limits apply as before) and decoded there, careful path and repairs
included, with the result and errors of before. Such files are small or
rejected, so holding them whole costs little. ``[memory]`` marks in the header
text (none in real traces) are looked for in the prefix and suffix apart.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec
import pyarrow as pa

from stallscope.ingest.formats import TableReader
from stallscope.ingest.kineto.decode import (
    _ANY,
    _EVENTS_KEY,
    _TOP,
    UTF8_BOM,
    KinetoDecoded,
    _decode_piece,
    _decoded,
    decode_kineto,
)
from stallscope.ingest.kineto.pieces import _BOUNDARY, CHUNK_BYTES, PieceDecoder, decode_workers
from stallscope.ingest.startup import give_back_freed_memory, skip_pandas_probe

Blocks = Callable[[], Iterator[bytes]]
_BLANKS = re.compile(rb"[ \t\r\n]*")
_KEY_LOOKBACK = 1 << 16  # a "traceEvents": [ cut between two blocks is found again from here


class _Whole(Exception):
    """The streamed decode gives up: decode the whole document instead (``data`` when the
    stream was read to its end and ``data`` is all of it, else None: read it again)."""

    def __init__(self, data: bytes | bytearray | None = None):
        super().__init__("whole document")
        self.data = data


def decode_stream(
    name: str,
    blocks: Blocks,
    trace_id: str,
    readers: Sequence[TableReader] = (),
    size_hint: int = 0,
) -> tuple[KinetoDecoded, list[tuple[TableReader, pa.Table, int]]]:
    """(decoded events, ``(reader, table, unreadable events)`` per further-table reader) of
    the document that ``blocks()`` yields (``Source.stream``); each reader's ``pieces``
    accumulator is fed the document's parts in order. ``size_hint`` (its expected size in
    bytes) decides on worker processes. The same results and errors as ``decode_kineto``
    and each reader's ``read`` over the whole document."""
    skip_pandas_probe()
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())  # see decode.decode_kineto
    try:
        try:
            return _streamed(blocks(), trace_id, readers, size_hint)
        except _Whole as whole:
            data = whole.data
    finally:
        pa.set_memory_pool(previous)
    if data is None:
        data = _read_all(blocks())
    further = [(r, *r.read(data, trace_id)) for r in readers]
    return decode_kineto(name, data), further


def _read_all(blocks: Iterator[bytes]) -> bytearray:
    data = bytearray()
    for block in blocks:
        data += block
    return data


class _Window:
    """The unread part of the stream: ``buf`` from offset ``pos`` on, refilled block by block."""

    def __init__(self, blocks: Iterator[bytes]):
        self.blocks = blocks
        self.buf = bytearray()
        self.pos = 0

    def fill(self) -> bool:
        """One more block at the end of ``buf``; False when the stream has ended."""
        block = next(self.blocks, None)
        if block is None:
            return False
        self.buf += block
        return True

    def take(self, end: int) -> bytes:
        """``[`` + ``buf[pos:end]`` + ``]`` (one piece to decode); drops ``buf`` up to ``end``."""
        with memoryview(self.buf) as view:
            piece = b"".join((b"[", view[self.pos : end], b"]"))
        del self.buf[: end + 1]  # the piece and the comma after it (bytearray: no copy)
        self.pos = 0
        return piece

    def read_to_end(self) -> bytearray:
        while self.fill():
            pass
        return self.buf


class _Parts:
    """Every further-table reader's accumulator, fed the same parts of the document."""

    def __init__(self, readers: Sequence[TableReader]):
        if any(reader.pieces is None for reader in readers):
            raise _Whole()  # a reader that reads only whole documents: decode the whole one
        self.readers = list(readers)
        self.accumulators = [reader.pieces() for reader in self.readers]

    def add(self, part: bytes | bytearray | memoryview) -> None:
        for accumulator in self.accumulators:
            accumulator.add(part)

    def tables(self, trace_id: str) -> list[tuple[TableReader, pa.Table, int]]:
        return [
            (r, *a.table(trace_id)) for r, a in zip(self.readers, self.accumulators, strict=True)
        ]


def _streamed(
    blocks: Iterator[bytes], trace_id: str, readers: Sequence[TableReader], size_hint: int
):
    window = _Window(blocks)
    parts = _Parts(readers)
    prefix = _start(window)
    if prefix:
        parts.add(prefix)
    workers = decode_workers(size_hint, max(1, size_hint // CHUNK_BYTES))
    decoder = PieceDecoder(_decode_piece, workers)
    was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived objects: the GC only slows this down
    try:
        while True:
            buf = window.buf
            if len(buf) - window.pos > CHUNK_BYTES * 3 // 2:
                match = _BOUNDARY.search(buf, window.pos + CHUNK_BYTES)
                if match:
                    piece = window.take(match.end() - 1)
                    parts.add(piece)
                    decoder.add(piece)
                    continue
            if not window.fill():
                break
        header, last, suffix = _end(window, prefix)
        if last is not None:
            parts.add(last)
            decoder.add(last)
        if suffix:
            parts.add(suffix)
        batches = decoder.finish()
    except msgspec.DecodeError:  # ValidationError included
        raise _Whole() from None
    finally:
        decoder.close()
        if was_enabled:
            gc.enable()
    decoded = _decoded(batches, header)
    result = (decoded, parts.tables(trace_id))
    give_back_freed_memory()  # the pieces' objects, freed into the C heap
    return result


def _start(window: _Window) -> bytes:
    """Reads up to the ``[`` of the events; returns the text before it (b"" for a bare array).

    Leaves ``window.pos`` just after the ``[``. Raises :class:`_Whole` for a document
    that is not an object with ``"traceEvents": [`` nor an array.
    """
    while len(window.buf) < len(UTF8_BOM) and window.fill():
        pass
    if window.buf[: len(UTF8_BOM)] == UTF8_BOM:  # see decode.decode_kineto
        del window.buf[: len(UTF8_BOM)]
    while (start := _BLANKS.match(window.buf).end()) == len(window.buf):
        if not window.fill():
            raise _Whole(window.buf)
    first = window.buf[start : start + 1]
    if first == b"[":
        window.pos = start + 1
        return b""
    if first != b"{":
        raise _Whole(window.read_to_end())
    searched = 0
    while (match := _EVENTS_KEY.search(window.buf, max(0, searched - _KEY_LOOKBACK))) is None:
        searched = len(window.buf)
        if not window.fill():
            raise _Whole(window.buf)
    window.pos = match.end()
    return bytes(window.buf[: match.end() - 1])


def _end(window: _Window, prefix: bytes) -> tuple[dict[str, Any], bytes | None, bytes]:
    """At the stream's end: (header, the last piece or None, the text after the array).

    The array ends at the last ``]`` (after blanks, for a bare array), as in
    ``decode._split_by_search``; a wrong guess fails the last piece's decode or the
    header's parse (-> :class:`_Whole`).
    """
    buf = window.buf
    if not prefix:
        end = len(buf.rstrip(b" \t\r\n"))
        if end <= window.pos or buf[end - 1 : end] != b"]":
            raise _Whole()
        close, suffix, header = end - 1, b"", {}
    else:
        close = buf.rfind(b"]", window.pos)
        if close < 0:
            raise _Whole()
        suffix = bytes(buf[close + 1 :])
        try:
            top = _TOP.decode(b"".join((prefix, b"[]", suffix)))
        except msgspec.DecodeError:
            raise _Whole() from None
        events = top.pop("traceEvents", None)
        if events is None or bytes(events) != b"[]":
            raise _Whole()
        header = {key: _ANY.decode(value) for key, value in top.items()}
    last = window.take(close) if close > window.pos else None
    return header, last, suffix
