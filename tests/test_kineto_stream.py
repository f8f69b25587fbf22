"""The streamed Kineto decode (ingest/kineto/stream.py) gives what the whole-document decode
gives, never holding the whole file on the clean path; Source.stream() reads what read() does."""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stallscope.errors import InputError
from stallscope.ingest.kineto import decode as kineto_decode
from stallscope.ingest.kineto import pieces as kineto_pieces
from stallscope.ingest.kineto import stream as kineto_stream
from stallscope.ingest.kineto.memory import memory_table
from stallscope.ingest.kineto.parse import further_readers
from stallscope.ingest.reader import expand_path
from tests.kineto_builder import KinetoTrace, many_ops_trace


def _trace(events: int = 3000) -> KinetoTrace:
    return many_ops_trace(events, memory_every=50)


def _blocks(data: bytes, size: int = 5000):
    """A ``Source.stream``-like factory: ``data`` in blocks of ``size`` bytes."""
    return lambda: iter([data[i : i + size] for i in range(0, len(data), size)])


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(kineto_stream, "CHUNK_BYTES", 16 << 10)
    monkeypatch.setattr(kineto_pieces, "CHUNK_BYTES", 16 << 10)
    monkeypatch.setenv("STALLSCOPE_DECODE_WORKERS", "1")


def _decode(data: bytes):
    """(decoded, memory table, unreadable [memory] events): the streamed decode with the
    folder's further-table readers (the memory one among them)."""
    readers = further_readers()
    decoded, further = kineto_stream.decode_stream("t.json", _blocks(data), "tid", readers)
    ((memory, unreadable),) = [(t, n) for r, t, n in further if r.table == "memory"]
    return decoded, memory, unreadable


def _same(data: bytes, monkeypatch, *, whole: bool) -> None:
    """decode_stream == decode_kineto + memory_table on ``data``; ``whole``: whether the
    stream must give up and decode the whole document (told by watching decode_kineto)."""
    calls = []
    real = kineto_decode.decode_kineto
    monkeypatch.setattr(
        kineto_stream, "decode_kineto", lambda *a: calls.append(1) or real(*a), raising=True
    )
    streamed, memory, unreadable = _decode(data)
    expected = real("t.json", data)
    expected_memory, expected_unreadable = memory_table(data, "tid")
    assert bool(calls) is whole
    for table in ("events", "gpu_args", "others"):
        assert getattr(streamed, table).equals(getattr(expected, table)), table
    assert streamed.header == expected.header
    assert streamed.warnings == expected.warnings
    assert memory.equals(expected_memory)
    assert unreadable == expected_unreadable


def test_streamed_equals_whole_document(small_pieces, monkeypatch):
    data = _trace().render().encode()
    assert len(data) > 10 * (16 << 10)  # many pieces
    _same(data, monkeypatch, whole=False)
    streamed, memory, _ = _decode(data)
    assert memory.num_rows == 60  # every [memory] event, in file order
    assert memory["total_allocated"].to_pylist()[:3] == [1000, 1050, 1100]
    assert streamed.header["distributedInfo"]["rank"] == 0


def test_header_keys_after_the_events_and_a_bare_array(small_pieces, monkeypatch):
    trace = _trace()
    text = trace.render()
    after = text[:-1] + ', "baseTimeNanoseconds": 1700000000000000000, "traceName": "x"}'
    streamed, _, _ = _decode(after.encode())
    assert streamed.header["baseTimeNanoseconds"] == 1700000000000000000
    assert streamed.header["schemaVersion"] == 1
    _same(after.encode(), monkeypatch, whole=False)
    _same(("\ufeff" + trace.render(bare_array=True) + "\n").encode(), monkeypatch, whole=False)


def test_a_list_after_the_events_falls_back_to_the_whole_document(small_pieces, monkeypatch):
    text = _trace().render()
    # The last ']' is not the events' end: the streamed guess fails, the whole path decodes.
    tail = ', "extra": [{"a": 1}, {"b": [2, 3]}], "z": 1}'
    _same((text[:-1] + tail).encode(), monkeypatch, whole=True)


def test_malformed_documents_take_the_careful_path(small_pieces, monkeypatch):
    text = _trace(400).render()
    # A NaN: the clean decode fails on its piece; the careful path repairs it, with a warning.
    broken = text.replace('"dur": 0.500,', '"dur": NaN,', 1)
    assert broken != text
    _same(broken.encode(), monkeypatch, whole=True)
    with pytest.raises(InputError, match="truncated JSON"):
        _decode(text[:-5000].encode())


def test_source_stream_reads_what_read_reads(tmp_path: Path):
    data = _trace(2000).render().encode()
    plain = tmp_path / "plain.json"
    plain.write_bytes(data)
    members = tmp_path / "two.json.gz"  # two gzip members and zero padding after them
    members.write_bytes(gzip.compress(data[:9000]) + gzip.compress(data[9000:]) + b"\0" * 64)
    archive = tmp_path / "job.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("rank0.json.gz", gzip.compress(data))
    for path in (plain, members, archive):
        _, [source] = expand_path(str(path))
        assert b"".join(source.stream()) == bytes(source.read()), path.name
        assert source.decompressed_size_hint() > 0


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        (lambda gz: gz[:-20], "truncated gzip file"),
        (lambda gz: gz + b"garbage", "unexpected bytes after the compressed data"),
        (lambda gz: gz[:40] + bytes(b ^ 0xFF for b in gz[40:60]) + gz[60:], "corrupt gzip"),
    ],
)
def test_source_stream_refuses_bad_gzip_as_read_does(tmp_path: Path, stored, message):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(stored(gzip.compress(_trace(500).render().encode())))
    _, [source] = expand_path(str(path))
    with pytest.raises(InputError) as by_read:
        source.read()
    source.release()
    with pytest.raises(InputError) as by_stream:
        b"".join(source.stream())
    assert message in str(by_read.value)
    assert str(by_stream.value) == str(by_read.value)


def test_ingest_of_a_big_plain_file_is_streamed(tmp_path: Path, monkeypatch):
    """A plain Kineto file above STREAM_MIN_BYTES is never read whole by the ingest."""
    from stallscope.ingest import job

    monkeypatch.setattr(job, "STREAM_MIN_BYTES", 1 << 10)
    path = tmp_path / "rank0.json"
    path.write_bytes(_trace(2000).render().encode())
    _, [source] = expand_path(str(path))
    assert job.streamable(source)
    assert job.streamed_format(source) == "kineto"
    source.loader = lambda: pytest.fail("the whole file was read")  # type: ignore[method-assign]
    job.RanksHere().hashes([source])
    assert source._raw is None
    [meta] = job.HERE.ingest(
        [source], [source.file_hash], "job", tmp_path, single=True, progress=None
    )
    assert meta["rank"] == 0
    assert pq.read_table(tmp_path / meta["trace_id"] / "gpu.parquet").num_rows == 667


def test_a_reader_without_pieces_makes_the_stream_decode_the_whole_document(
    small_pieces, monkeypatch
):
    """A further-table reader that reads only whole documents (no ``pieces``) still gets the
    whole document: the streamed decode gives up and the result is the whole path's."""
    import dataclasses

    data = _trace().render().encode()
    whole_only = [dataclasses.replace(r, pieces=None) for r in further_readers()]
    calls = []
    real = kineto_decode.decode_kineto
    monkeypatch.setattr(kineto_stream, "decode_kineto", lambda *a: calls.append(1) or real(*a))
    decoded, further = kineto_stream.decode_stream("t.json", _blocks(data), "tid", whole_only)
    assert calls, "the whole-document path decoded it"
    ((memory, unreadable),) = [(t, n) for r, t, n in further if r.table == "memory"]
    assert memory.equals(memory_table(data, "tid")[0]) and memory.num_rows == 60
    assert decoded.events.equals(real("t.json", data).events)
