"""benchmarks/columnar_decode_probe.py: the candidates it times find what they claim to find.

The probe's numbers (docs/benchmarks.md, issue #15) are only worth having if the
byte-scan boundaries are the real element boundaries and the columnar readers
give the same nanosecond times as the decoder in use; checked here on a small
body whose answers are known by hand.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from stallscope.ingest.kineto.decode import decode_kineto

REPO = Path(__file__).resolve().parents[1]


def _probe():
    spec = importlib.util.spec_from_file_location(
        "columnar_decode_probe", REPO / "benchmarks" / "columnar_decode_probe.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Strings holding what a byte search could take for a boundary: an escaped quote
# followed by "}, {", brackets, and a name ending in a backslash (an even run).
EVENTS = (
    b'{"ph": "X", "cat": "cpu_op", "name": "a \\"}, {\\" [b]", "pid": 1, "tid": 2,'
    b' "ts": 1669783687464181.047, "dur": 45, "args": {"External id": 7}}',
    b'{"ph": "X", "cat": "kernel", "name": "k\\\\", "pid": 0, "tid": 7,'
    b' "ts": 1669783687464190, "dur": 2.5, "args": {"grid": [1, 2, 3], "stream": 7}}',
    b'{"ph": "i", "name": "mark, {x}", "pid": 1, "tid": 2, "ts": 1669783687464200}',
)
BODY = b"[\n  " + b",\n  ".join(EVENTS) + b"\n]"


def test_top_level_commas_are_the_element_boundaries():
    probe = _probe()
    commas = probe.top_level_commas(memoryview(BODY))
    first = BODY.index(EVENTS[0]) + len(EVENTS[0])
    second = BODY.index(EVENTS[1]) + len(EVENTS[1])
    assert commas.tolist() == [first, second]


def test_pieces_split_only_at_boundaries(monkeypatch):
    probe = _probe()
    monkeypatch.setattr(probe, "PIECE_BYTES", 40)
    body = memoryview(BODY)
    pieces = probe._pieces(body, probe.top_level_commas(body))
    assert [bytes(body[s:e]).strip() for s, e in pieces] == list(EVENTS)


def test_columnar_candidates_give_the_decoders_nanoseconds(tmp_path):
    probe = _probe()
    data = b'{"traceEvents": ' + BODY + b"}"
    decoded = decode_kineto("t.json", data).events
    want = decoded.filter(pc.equal(decoded["ph"], "X"))["ts_fast_ns"].to_pylist()
    assert want == [1669783687464181047, 1669783687464190000]

    table = probe.decode_pyarrow_json(probe.events_array(data))
    table = table.filter(pc.equal(table["ph"], "X"))
    assert probe._decimal_ns(table["ts"]).tolist() == want
    assert table["name"].to_pylist() == ['a "}, {" [b]', "k\\"]

    body_file = tmp_path / "body.json"
    body_file.write_bytes(BODY)
    table = probe.decode_duckdb(str(body_file))
    table = table.filter(pc.equal(table["ph"], "X"))
    assert table["ts_ns"].to_pylist() == want
    assert table["dur_ns"].to_pylist() == [45_000, 2_500]

    events, gpu, others = probe.decode_duckdb_tables(str(body_file))
    assert events["ts_ns"].to_pylist() == want
    assert np.array(gpu["args"][0].as_py()[:7], dtype=object).tolist() == [
        None, "7", None, None, None, "[1,2,3]", None,
    ]  # fmt: skip
    assert others["name"].to_pylist() == ["mark, {x}"]
