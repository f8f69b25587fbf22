"""Reading and hashing stored files: one pass, the same bytes and hash as reading then hashing."""

from __future__ import annotations

import hashlib

import pytest

from stallscope.errors import InputError
from stallscope.ingest import reader
from stallscope.ingest.reader import expand_path


@pytest.mark.parametrize("size", [0, 1, 5, (1 << 20) + 3])
def test_load_hashed_equals_read_then_sha256(tmp_path, monkeypatch, size):
    monkeypatch.setattr(reader, "_HASH_BLOCK", 1 << 16)  # many blocks
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    path = tmp_path / "t.json"
    path.write_bytes(data)
    _, [source] = expand_path(str(path))
    source.load_hashed()
    assert bytes(source.raw()) == data
    assert source.file_hash == hashlib.sha256(data).hexdigest()  # what sha256sum prints


def test_a_file_that_changed_size_since_listed_is_read_whole(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b"a" * 1000)
    _, [grown] = expand_path(str(path))
    _, [shrunk] = expand_path(str(path))
    path.write_bytes(b"b" * 3000)
    grown.load_hashed()
    assert bytes(grown.raw()) == b"b" * 3000
    assert grown.file_hash == hashlib.sha256(b"b" * 3000).hexdigest()
    path.write_bytes(b"c" * 10)
    shrunk.load_hashed()
    assert bytes(shrunk.raw()) == b"c" * 10
    assert shrunk.file_hash == hashlib.sha256(b"c" * 10).hexdigest()


def test_unreadable_file_is_an_input_error(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b"{}")
    _, [source] = expand_path(str(path))
    path.unlink()
    with pytest.raises(InputError, match="cannot read file"):
        source.load_hashed()
