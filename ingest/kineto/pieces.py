"""Cut a Kineto ``traceEvents`` array into pieces and decode them, in parallel where it pays.

A well-formed ``[e1, e2, ...]`` is cut at event boundaries (``}`` ``,`` ``{``
found by a byte search) into pieces of about :data:`CHUNK_BYTES`. Pieces are
independent, so a big trace is decoded by several forked worker processes,
each reading its pieces from the parent's bytes (shared copy-on-write, never
sent) and sending back the piece's Arrow batches (one IPC stream each), in order.

Where it runs in parallel (:func:`decode_workers`): on Linux, in the
``stallscope`` command, for bodies of at least :data:`PARALLEL_MIN_BYTES`,
on machines with at least ``startup.MIN_CPUS`` usable CPUs, with one worker
per CPU (at most one per piece, at most ``startup.MAX_WORKERS``:
``startup.worker_processes``).
``STALLSCOPE_DECODE_WORKERS=N`` sets the count anywhere (``1`` turns it
off). Not in the dashboard server by default: forking a process that runs
many threads is not safe.

Contract: the batches are the same, row for row, as decoding the pieces one
by one in this process; a piece that fails to decode (``msgspec.DecodeError``,
which includes validation errors) makes :func:`decode_pieces` raise it, as the
serial loop would, so the caller takes its careful path. A worker that dies
(killed, out of memory) makes the whole body decode again in this process.
"""

from __future__ import annotations

import multiprocessing
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import msgspec
import pyarrow as pa

from stallscope.ingest.startup import worker_processes

CHUNK_BYTES = 4 << 20  # ~16k events: a piece's objects stay in cache (measured: 2-4 MB best)
PARALLEL_MIN_BYTES = 128 << 20  # below this, workers cost more (time, memory) than they save
_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,(?=[ \t\r\n]*\{)")

Batches = tuple[pa.RecordBatch, ...]
DecodePiece = Callable[[bytes], Batches]


class LastPieceError(msgspec.DecodeError):
    """The last piece (decoded first, ``last_first``) did not decode."""


def piece_bounds(body: memoryview) -> list[tuple[int, int]]:
    """``[e1, e2, ...]`` -> (start, end) byte ranges of runs of events, about CHUNK_BYTES each.

    The ranges exclude the brackets and the commas between pieces; each piece
    is decoded as ``b"[" + body[start:end] + b"]"``.
    """
    bounds = []
    end = len(body) - 1  # the closing bracket
    start = 1
    while start < end:
        cut = end
        if end - start > CHUNK_BYTES * 3 // 2:
            match = _BOUNDARY.search(body, start + CHUNK_BYTES, end)
            if match:
                cut = match.end() - 1  # the comma
        bounds.append((start, cut))
        start = cut + 1
    return bounds


def piece_bytes(body: memoryview, bound: tuple[int, int]) -> bytes:
    return b"".join((b"[", body[bound[0] : bound[1]], b"]"))


def decode_workers(body_bytes: int, pieces: int) -> int:
    """How many worker processes decode a body of ``body_bytes`` cut into ``pieces``; 1 = none."""
    return max(1, min(worker_processes(body_bytes >= PARALLEL_MIN_BYTES), pieces))


def decode_pieces(
    body: memoryview, decode: DecodePiece, *, last_first: bool = False
) -> list[Batches]:
    """Every piece of ``body`` decoded by ``decode``, in order (see the module docstring).

    ``last_first`` decodes the last piece before any other, here: when the
    body's end is a guess, a wrong guess then fails before the work is done,
    with :class:`LastPieceError` (a ``DecodeError``), told apart from a bad
    piece elsewhere.
    """
    bounds = piece_bounds(body)
    last = []
    if last_first and bounds:
        try:
            last = [decode(piece_bytes(body, bounds.pop()))]
        except msgspec.DecodeError as exc:
            raise LastPieceError(str(exc)) from exc
    workers = decode_workers(len(body), len(bounds))
    if workers > 1:
        try:
            return list(_parallel(body, bounds, decode, workers)) + last
        except BrokenProcessPool:
            pass  # a worker died: decode here instead
    return [decode(piece_bytes(body, bound)) for bound in bounds] + last


# What the forked workers read: set just before the pool starts, cleared after.
_JOB: tuple[memoryview, list[tuple[int, int]], DecodePiece] | None = None


def _parallel(
    body: memoryview, bounds: list[tuple[int, int]], decode: DecodePiece, workers: int
) -> Iterator[Batches]:
    global _JOB
    _JOB = (body, bounds, decode)
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            results = list(pool.map(_decode_in_worker, range(len(bounds))))
    finally:
        _JOB = None
    for result in results:
        if isinstance(result, str):
            raise msgspec.DecodeError(result)
        yield tuple(pa.ipc.open_stream(stream).read_next_batch() for stream in result)


def _decode_in_worker(index: int) -> list[bytes] | str:
    """One piece, in a worker: one Arrow IPC stream per batch, or the decode error's text."""
    assert _JOB is not None, "worker started without a job (not forked?)"
    body, bounds, decode = _JOB
    try:
        batches = decode(piece_bytes(body, bounds[index]))
    except msgspec.DecodeError as exc:
        return str(exc) or "decode error"
    streams = []
    for batch in batches:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        streams.append(sink.getvalue().to_pybytes())
    return streams


class PieceDecoder:
    """Decode pieces handed over one at a time, in order, in worker processes when
    ``workers`` > 1 (the streamed decode, ``stream.py``): each piece's bytes are sent to a
    forked worker (at most two per worker in flight, so a few pieces' bytes are held, never
    the body), its batches come back as in :func:`decode_pieces`. A worker that dies makes
    the pieces still out decode here, and the rest too. Raises the ``msgspec.DecodeError``
    of a piece that fails, as the serial loop would.
    """

    def __init__(self, decode: DecodePiece, workers: int):
        self.decode = decode
        self.results: list[Batches] = []
        self.pool: ProcessPoolExecutor | None = None
        self.window = 2 * workers
        self.out: list[tuple[object, bytes]] = []  # (future, piece), oldest first
        if workers > 1:
            context = multiprocessing.get_context("fork")
            self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)

    def add(self, piece: bytes) -> None:
        if self.pool is None:
            self.results.append(self.decode(piece))
            return
        try:
            self.out.append((self.pool.submit(_decode_sent, self.decode, piece), piece))
        except BrokenProcessPool:
            self._serial_from_now(newest=piece)
            return
        while len(self.out) >= self.window:
            self._collect_oldest()

    def finish(self) -> list[Batches]:
        while self.out:
            self._collect_oldest()
        self.close()
        return self.results

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def _collect_oldest(self) -> None:
        future, piece = self.out.pop(0)
        try:
            result = future.result()  # type: ignore[attr-defined]
        except BrokenProcessPool:
            self._serial_from_now(oldest=piece)
            return
        if isinstance(result, str):
            raise msgspec.DecodeError(result)
        self.results.append(
            tuple(pa.ipc.open_stream(stream).read_next_batch() for stream in result)
        )

    def _serial_from_now(self, oldest: bytes | None = None, newest: bytes | None = None) -> None:
        """A worker died: the pieces still out (``oldest``, taken out of them, or ``newest``,
        never sent) are decoded here, in order, as are the next ones."""
        pieces = [oldest] if oldest is not None else []
        pieces += [sent for _, sent in self.out] + ([newest] if newest is not None else [])
        self.out = []
        self.close()
        for one in pieces:
            self.results.append(self.decode(one))


def _decode_sent(decode: DecodePiece, piece: bytes) -> list[bytes] | str:
    """One piece sent to a worker: one Arrow IPC stream per batch, or the decode error's text."""
    try:
        batches = decode(piece)
    except msgspec.DecodeError as exc:
        return str(exc) or "decode error"
    return [_ipc(batch) for batch in batches]


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()
