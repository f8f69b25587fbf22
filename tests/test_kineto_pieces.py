"""Parallel piece decoding gives the same table as decoding here, and falls back safely."""

from __future__ import annotations

import os
import sys

import msgspec
import pytest

from stallscope.ingest import startup
from stallscope.ingest.kineto import decode as kineto_decode
from stallscope.ingest.kineto import pieces as kineto_pieces
from tests.kineto_builder import many_ops_trace

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="workers are forked")


def _trace(events: int = 3000) -> bytes:
    return many_ops_trace(events).render().encode()


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(kineto_pieces, "CHUNK_BYTES", 16 << 10)


def _decode(data: bytes, workers: str, monkeypatch) -> kineto_decode.KinetoDecoded:
    monkeypatch.setenv("STALLSCOPE_DECODE_WORKERS", workers)
    return kineto_decode.decode_kineto("t.json", data)


def test_parallel_decode_equals_serial(small_pieces, monkeypatch):
    data = _trace()
    body = memoryview(data)[data.index(b'"traceEvents": ') + 15 : -1]
    assert len(kineto_pieces.piece_bounds(body)) > 20  # many pieces, several per worker
    serial = _decode(data, "1", monkeypatch)
    parallel = _decode(data, "3", monkeypatch)
    assert parallel.events.num_rows == serial.events.num_rows == 3000 + 1000 + 1
    assert parallel.events.equals(serial.events)
    assert parallel.gpu_args.equals(serial.gpu_args)
    assert parallel.header == serial.header and parallel.warnings == serial.warnings == []


def test_piece_that_fails_in_a_worker_sends_the_file_down_the_careful_path(
    small_pieces, monkeypatch
):
    good = _trace(1000)
    # Valid JSON, but one event's args is a list: that piece fails to decode into
    # events (in whichever worker has it) and the careful path skips the one event.
    at = good.rindex(b'"args": {', 0, len(good) // 2)
    bad = good[:at] + good[at:].replace(b'"args": {"External id": 1}', b'"args": [1]', 1)
    assert bad != good
    parsed_whole = []
    real_top = kineto_decode._TOP

    class Spy:
        def decode(self, data):
            parsed_whole.append(len(data) == len(bad))
            return real_top.decode(data)

    monkeypatch.setattr(kineto_decode, "_TOP", Spy())
    serial = _decode(bad, "1", monkeypatch)
    parallel = _decode(bad, "2", monkeypatch)
    # The array was found right (its last piece decoded): no second parse of the whole file
    # before the careful path, which splits the top level once itself.
    assert parsed_whole.count(True) == 2  # once per decode, by the careful path
    assert serial.warnings == ["skipped 1 malformed events (not trace-event objects)"]
    assert parallel.warnings == serial.warnings
    assert parallel.events.equals(serial.events)
    assert parallel.gpu_args.equals(serial.gpu_args)
    assert parallel.events.num_rows == 1000 + 334 + 1 - 1


def test_a_worker_that_dies_means_decoding_here(small_pieces, monkeypatch):
    data = _trace(500)
    body = memoryview(data)[data.index(b'"traceEvents": ') + 15 : -1]
    parent = os.getpid()
    calls = []

    def decode(piece: bytes):
        if os.getpid() != parent:
            os._exit(1)  # a worker killed mid-piece (out of memory, say)
        calls.append(len(piece))
        return kineto_decode._decode_piece(piece)

    monkeypatch.setenv("STALLSCOPE_DECODE_WORKERS", "2")
    batches = kineto_pieces.decode_pieces(body, decode)
    assert len(calls) == len(batches) == len(kineto_pieces.piece_bounds(body))
    assert sum(events.num_rows for events, _, _ in batches) == 500 + 167 + 1
    assert sum(gpu.num_rows for _, gpu, _ in batches) == 167  # the kernels


def test_worker_count(monkeypatch):
    monkeypatch.delenv("STALLSCOPE_DECODE_WORKERS", raising=False)
    big = kineto_pieces.PARALLEL_MIN_BYTES
    assert kineto_pieces.decode_workers(big, 50) == 1  # not the CLI: no forking by default
    monkeypatch.setattr(startup, "in_cli", lambda: True)  # as imported there
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    expected = 4 if sys.platform == "linux" else 1
    assert kineto_pieces.decode_workers(big, 50) == expected
    assert kineto_pieces.decode_workers(big, 3) == min(expected, 3)  # no more workers than pieces
    assert kineto_pieces.decode_workers(big - 1, 50) == 1  # small: not worth starting workers
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert kineto_pieces.decode_workers(big, 50) == 1  # 2 CPUs: measured slower with workers
    monkeypatch.setenv("STALLSCOPE_DECODE_WORKERS", "2")
    assert kineto_pieces.decode_workers(10, 50) == 2
    monkeypatch.setenv("STALLSCOPE_DECODE_WORKERS", "nonsense")
    assert kineto_pieces.decode_workers(big, 50) == 1


def _reordered(data: bytes, note: str) -> list[bytes]:
    """The same trace with its header keys before, after and around ``traceEvents``."""
    head, events = data.split(b', "traceEvents": ', 1)
    events = events[:-1]  # without the document's closing brace
    header = head + b"}"
    extra = b'"deviceProperties": [{"id": 0, "name": "after the events"}], "note": ' + note.encode()
    return [
        data,
        b'{"traceEvents": ' + events + b", " + header[1:],  # every key after the array
        header[:-1] + b', "traceEvents": ' + events + b", " + extra + b"}",  # a list after it
        b'{"title": "\\"traceEvents\\": [", "traceEvents": '
        + events
        + b"}",  # key text in a string
        header[:-1] + b', "traceEvents": []}',  # no events
    ]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_events_array_found_by_search_matches_a_full_parse(small_pieces, monkeypatch, workers):
    monkeypatch.setenv("STALLSCOPE_DECODE_WORKERS", workers)
    for document in _reordered(_trace(600), '"] ]"'):
        fast = kineto_decode.decode_kineto("t.json", document)
        with monkeypatch.context() as m:
            m.setattr(kineto_decode, "_split_by_search", lambda data: None)
            parsed = kineto_decode.decode_kineto("t.json", document)
        assert fast.header == parsed.header
        assert fast.events.equals(parsed.events)
        assert fast.gpu_args.equals(parsed.gpu_args)
        assert fast.warnings == parsed.warnings == []


def test_thread_budget(monkeypatch):
    """A Dask task's budget (its worker's threads) or $STALLSCOPE_THREADS caps DuckDB's threads."""
    monkeypatch.delenv("STALLSCOPE_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    try:
        startup.set_thread_budget(None)
        assert startup.thread_budget() is None
        if sys.platform == "linux":
            assert startup.duckdb_threads() == 8  # 16 CPUs, capped
        startup.set_thread_budget(1)
        assert startup.duckdb_threads() == 1
        startup.set_thread_budget(32)
        assert startup.duckdb_threads() == 8  # never more than the cap
        startup.set_thread_budget(None)
        monkeypatch.setenv("STALLSCOPE_THREADS", "3")
        assert startup.thread_budget() == 3
        assert startup.duckdb_threads() == 3
        monkeypatch.setenv("STALLSCOPE_THREADS", "nonsense")
        assert startup.thread_budget() is None
    finally:
        startup.set_thread_budget(None)


# Events of every kind the two decodes of a piece treat apart: read rows (X, M), others
# (flows, instants with args, a counter, a negative and a non-number dur), odd fields.
_MIXED_EVENTS = [
    b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": "Spans", "ts": 1.047,'
    b' "dur": 2, "args": {"External id": 5, "external id": 9, "Input Dims": [[1, 2]]}}',
    b'{"ph": "M", "name": "process_name", "pid": "7", "tid": 0, "args": {"name": "python"}}',
    b'{"cat": "kernel", "ph": "X", "name": "k", "pid": 0, "tid": 7, "ts": 1e3, "dur": -1.5,'
    b' "args": {"device": 0, "stream": 7, "correlation": 3, "grid": [1, 2, 3]}}',
    b'{"ph": "s", "id": 3, "cat": "ac2g", "name": "ac2g", "pid": 1, "tid": 1, "ts": 5}',
    b'{"ph": "f", "id": 3, "cat": "ac2g", "name": 12, "pid": 1, "tid": 1, "ts": 6, "bp": "e"}',
    b'{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 7, "dur": "-3",'
    b' "args": {"Bytes": 8, "Addr": 1, "nested": {"a": [1]}}}',
    b'{"ph": "C", "name": "counter", "ts": 8, "dur": -2, "args": null}',
]


@pytest.mark.parametrize(
    "odd",
    [
        None,  # every ph known: decoded by ph
        b'{"ph": "Z", "name": "unknown phase", "ts": 9}',  # -> decoded as Event s
        b'{"name": "no phase", "ts": 9, "dur": -1}',
        b'{"ph": 1, "name": "phase not a string"}',
    ],
)
def test_piece_decoded_by_phase_equals_decoded_as_events(odd):
    events = _MIXED_EVENTS + ([odd] if odd else [])
    piece = b"[" + b",\n".join(events) + b"]"
    if odd is None:  # the tagged decode takes it (the others fall back to Event s)
        assert len(kineto_decode._TAGGED_LIST.decode(piece)) == len(events)
    else:
        with pytest.raises(msgspec.ValidationError):
            kineto_decode._TAGGED_LIST.decode(piece)
    by_phase = kineto_decode._decode_piece(piece)
    as_events = kineto_decode._to_batch(kineto_decode._EVENTS_LIST.decode(piece))
    assert [t.num_rows for t in by_phase] == [3, 1, len(events) - 3]
    for got, expected in zip(by_phase, as_events, strict=True):
        assert got.equals(expected), (got.to_pylist(), expected.to_pylist())


def test_piece_whose_other_event_has_args_not_an_object_fails_either_way():
    piece = b"[" + b",".join([*_MIXED_EVENTS, b'{"ph": "f", "name": "x", "args": [1]}']) + b"]"
    with pytest.raises(msgspec.DecodeError):
        kineto_decode._EVENTS_LIST.decode(piece)
    with pytest.raises(msgspec.DecodeError):  # not read, but checked as before: careful path
        kineto_decode._decode_piece(piece)
