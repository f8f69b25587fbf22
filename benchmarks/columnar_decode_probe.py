"""Would a columnar decode beat the msgspec one? Each candidate timed in its own process.

    python benchmarks/columnar_decode_probe.py TRACE.json [--runs 3] [--check]

Issue #15 asks for >= 150 MB of Kineto JSON per CPU second. The decode in
``ingest/kineto/decode.py`` parses with msgspec into small structs (~10 Python
objects per event) and turns them into Arrow columns. The candidates here decode
the same ``traceEvents`` array without per-event Python objects:

* ``current``: ``decode_kineto`` as the ingest runs it (the reference);
* ``msgspec split``: ``list[msgspec.Raw]``, the parse alone cut into raw events
  (a floor for any msgspec design: no field is read);
* ``msgspec structs``: the current structs, decoded and dropped (no columns);
* ``numpy boundaries``: the events' boundaries found by vectorised byte scans
  (quote and backslash masks -> in-string mask -> bracket depth by cumsum ->
  top-level commas), no field read: what a chunked columnar reader would
  pay before its parser runs;
* ``pyarrow.json``: each ~4 MB piece rewritten as newline-delimited JSON
  (newlines blanked, the boundary commas made newlines) and read with an
  explicit schema, ``ts``/``dur`` as ``decimal128(22, 3)`` (exact for up to 3
  decimals) and the GPU args as a struct. A lower bound: ``pid``/``tid`` are
  left out because Arrow refuses a column that holds both numbers and strings
  (``"pid": "Spans"`` beside integer pids, in real traces);
* ``duckdb read_json``: one thread, explicit columns, ``ts``/``dur``
  ``DECIMAL(22,3)`` -> BIGINT nanoseconds, reading the array from a file.
  Also a lower bound: DuckDB's struct keys are case-insensitive, so
  ``External id``/``external id``, ``Seq``/``seq`` and ``Input Dims``/``Input
  dims`` cannot be two fields (one of each is left out here);
* ``polars ndjson`` (polars 2.1, when installed: not a dependency): each piece
  that the ingest cuts (``pieces.piece_bounds``) split into its events by
  msgspec (``list[Raw]``), made newline-delimited JSON and read by
  ``polars.read_ndjson`` on one thread with an explicit schema of the fields
  the ingest reads (``pid``/``tid`` and ``ts``/``dur`` as strings, the GPU
  args in a struct). Not exact: polars reads every JSON number as a float64
  first, so ``1669783687464181.047`` comes back as ``"1669783687464181"``
  (``--check`` shows it), and a ``Decimal`` column is refused
  ("found value of type Float64").

Each run is a fresh process that holds the file's bytes (as the ingest does),
times the candidate alone (CPU seconds of the process: user + system, all
threads) and reports its peak RSS. ``--check`` (one process) checks that the
columnar candidates give the same nanosecond ``ts`` as the current decode.
Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa

CANDIDATES = (
    "current",
    "msgspec split",
    "msgspec structs",
    "numpy boundaries",
    "pyarrow.json",
    "duckdb read_json",
    "duckdb 3 tables",
    "polars ndjson",
)
PIECE_BYTES = 4 << 20
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("{"), ord("[")]] = 1
_OPEN[[ord("}"), ord("]")]] = -1
_BLANK_NEWLINES = bytes.maketrans(b"\n\r", b"  ")


def events_array(data: bytes) -> memoryview:
    """The ``[...]`` text of ``traceEvents`` (the benchmark traces are well formed)."""
    key = data.find(b'"traceEvents"')
    start = data.index(b"[", key)
    return memoryview(data)[start : data.rindex(b"]") + 1]


def top_level_commas(body: memoryview) -> np.ndarray:
    """Positions of the commas between the array's elements, by vectorised byte scans."""
    a = np.frombuffer(body, dtype=np.uint8)
    quotes = np.flatnonzero(a == ord('"'))
    after_backslash = quotes[(quotes > 0) & (a[quotes - 1] == ord("\\"))]
    escaped = [q for q in after_backslash.tolist() if _backslashes_before(a, q) % 2]
    if escaped:  # rare: a quote after an odd run of backslashes is part of a string
        quotes = np.setdiff1d(quotes, escaped)
    # Inside a string: an odd number of real quotes at or before the byte (a closing
    # quote counts as outside, which is harmless: it is neither a bracket nor a comma).
    # int8 sums wrap around, which keeps their parity.
    marks = np.zeros(len(a), dtype=np.int8)
    marks[quotes] = 1
    in_string = (np.cumsum(marks, dtype=np.int8) & 1).astype(bool)
    # int8 depth: Kineto nests a few levels; a wrong cut (depth past 127) fails to parse.
    depth = np.cumsum(np.where(in_string, 0, _OPEN[a]), dtype=np.int8)
    return np.flatnonzero((a == ord(",")) & (depth == 1) & ~in_string)


def _backslashes_before(a: np.ndarray, position: int) -> int:
    count = 0
    while position - count - 1 >= 0 and a[position - count - 1] == ord("\\"):
        count += 1
    return count


def _pieces(body: memoryview, commas: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of runs of whole elements of about PIECE_BYTES, commas excluded."""
    bounds, start = [], 1
    after = np.searchsorted(commas, np.arange(PIECE_BYTES, len(body), PIECE_BYTES))
    cuts = commas[after[after < len(commas)]]  # the first comma after each PIECE_BYTES
    for cut in [*np.unique(cuts).tolist(), len(body) - 1]:
        if cut > start:
            bounds.append((start, cut))
            start = cut + 1
    return bounds


def _arrow_schema() -> pa.Schema:
    i, s, f = pa.int64(), pa.string(), pa.float64()
    ints = ("device", "stream", "correlation", "External id", "external id", "registers per thread")
    ints += ("shared memory", "bytes", "wait_on_stream", "In msg nelems", "Out msg nelems")
    ints += ("Group size", "Seq", "seq")
    texts = ("kind", "cuda_sync_kind", "Collective name", "dtype", "name")
    texts += ("Process Group Name", "Process Group Description", "Process Group Ranks")
    floats = ("blocks per SM", "warps per SM", "est. achieved occupancy %")
    args = [(k, i) for k in ints] + [(k, s) for k in texts] + [(k, f) for k in floats]
    args += [("grid", pa.list_(i)), ("block", pa.list_(i))]
    exact = pa.decimal128(22, 3)
    return pa.schema(
        [("ph", s), ("cat", s), ("name", s), ("ts", exact), ("dur", exact)]
        + [("args", pa.struct(args))]
    )


def decode_pyarrow_json(body: memoryview) -> pa.Table:
    import pyarrow.json as pj

    commas = top_level_commas(body)
    parse = pj.ParseOptions(explicit_schema=_arrow_schema(), unexpected_field_behavior="ignore")
    tables = []
    for start, end in _pieces(body, commas):
        piece = bytearray(bytes(body[start:end]).translate(_BLANK_NEWLINES))
        inner = commas[(commas > start) & (commas < end)] - start
        np.frombuffer(piece, dtype=np.uint8)[inner] = ord("\n")
        read = pj.ReadOptions(use_threads=False, block_size=len(piece) + 1)
        tables.append(pj.read_json(io.BytesIO(piece), read_options=read, parse_options=parse))
    return pa.concat_tables(tables)


def decode_polars(body: memoryview) -> list[object]:
    import polars as pl

    from stallscope.ingest.kineto.pieces import piece_bounds, piece_bytes

    strings = ("ph", "cat", "name", "pid", "tid", "ts", "dur")
    kinds = {"String": pl.String, "Int64": pl.Int64, "Float64": pl.Float64}
    args = {}
    for field in _arrow_schema().field("args").type:
        kind = str(field.type)
        args[field.name] = (
            pl.List(pl.Int64) if kind.startswith("list") else
            kinds["Int64" if kind == "int64" else "Float64" if kind == "double" else "String"]
        )  # fmt: skip
    schema = {**{key: pl.String for key in strings}, "args": pl.Struct(args)}
    frames = []
    for bound in piece_bounds(body):
        events = msgspec.json.decode(piece_bytes(body, bound), type=list[msgspec.Raw])
        lines = b"\n".join(bytes(event).translate(_BLANK_NEWLINES) for event in events)
        frames.append(pl.read_ndjson(io.BytesIO(lines), schema=schema))
    return frames


def _duckdb_columns() -> str:
    kinds = {
        "BIGINT": ("device", "correlation", "External id", "registers per thread"),
        "VARCHAR": ("stream", "kind", "cuda_sync_kind", "Collective name", "dtype", "name"),
        "DOUBLE": ("blocks per SM", "warps per SM", "est. achieved occupancy %"),
        "BIGINT[]": ("grid", "block"),
        "JSON": ("Input Dims", "Input type"),
    }
    more = ("shared memory", "bytes", "wait_on_stream", "In msg nelems", "Out msg nelems")
    kinds["BIGINT"] += (*more, "Group size", "Seq")
    kinds["VARCHAR"] += ("Process Group Name", "Process Group Description")
    kinds["VARCHAR"] += ("Process Group Ranks",)
    args = ", ".join(f'"{key}" {kind}' for kind, keys in kinds.items() for key in keys)
    columns = {"ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "VARCHAR"}
    columns |= {"tid": "VARCHAR", "ts": "DECIMAL(22,3)", "dur": "DECIMAL(22,3)"}
    columns["args"] = f"STRUCT({args})"
    return "{" + ", ".join(f"{k}: '{v}'" for k, v in columns.items()) + "}"


def decode_duckdb(path: str) -> pa.Table:
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 1")
    return con.sql(
        "SELECT ph, cat, name, pid, tid, (ts * 1000)::BIGINT AS ts_ns,"
        " (dur * 1000)::BIGINT AS dur_ns, args"
        f" FROM read_json('{path}', format = 'array', columns = {_duckdb_columns()},"
        " maximum_object_size = 1000000000)"
    ).to_arrow_table()


_GPU_ARG_KEYS = (
    "device", "stream", "correlation", "External id", "external id", "grid", "block",
    "registers per thread", "shared memory", "blocks per SM", "warps per SM",
    "est. achieved occupancy %", "bytes", "kind", "cuda_sync_kind", "wait_on_stream",
    "Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype",
    "Process Group Name", "Process Group Description", "Process Group Ranks", "Seq", "seq",
)  # fmt: skip


def decode_duckdb_tables(path: str) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Closer to what the ingest needs: the three tables of ``decode.KinetoDecoded``.

    ``args`` is read as JSON text (its keys differ only by case in places), the
    common keys are extracted for the complete and metadata events, the GPU
    launch/copy/collective keys for GPU rows only; other events keep their
    name and the sign of ``dur``. Still a lower bound: no check that a value's
    JSON type is the one the current decode converts the same way.
    """
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 1")
    columns = "{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR',"
    columns += " ts: 'DECIMAL(22,3)', dur: 'DECIMAL(22,3)', args: 'JSON'}"
    con.execute(
        "CREATE TEMP TABLE raw AS SELECT row_number() OVER () AS i, * FROM read_json("
        f"'{path}', format = 'array', columns = {columns}, maximum_object_size = 1000000000)"
    )
    common = ("device", "stream", "correlation", "External id", "external id", "name")
    paths = ", ".join(f"'$.\"{key}\"'" for key in common)
    events = con.sql(
        f"SELECT ph, cat, name, pid, tid, (ts * 1000)::BIGINT AS ts_ns,"
        f" (dur * 1000)::BIGINT AS dur_ns, json_extract_string(args, [{paths}]) AS common"
        " FROM raw WHERE ph IN ('X', 'M') ORDER BY i"
    ).to_arrow_table()
    paths = ", ".join(f"'$.\"{key}\"'" for key in _GPU_ARG_KEYS)
    gpu = con.sql(
        f"SELECT json_extract_string(args, [{paths}]) AS args FROM raw WHERE ph IN ('X', 'M')"
        " AND lower(cat) IN ('kernel', 'gpu_memcpy', 'memcpy', 'gpu_memset', 'memset',"
        " 'cuda_sync') ORDER BY i"
    ).to_arrow_table()
    others = con.sql(
        "SELECT name, dur < 0 AS negative_dur FROM raw WHERE ph NOT IN ('X', 'M') ORDER BY i"
    ).to_arrow_table()
    return events, gpu, others


def run_candidate(name: str, data: bytes, body_path: str) -> object:
    from stallscope.ingest.kineto import decode

    body = events_array(data)
    if name == "current":
        return decode.decode_kineto("trace", data)
    if name == "msgspec split":
        return msgspec.json.decode(body, type=list[msgspec.Raw])
    if name == "msgspec structs":
        return decode._EVENTS_LIST.decode(body)
    if name == "numpy boundaries":
        return top_level_commas(body)
    if name == "pyarrow.json":
        return decode_pyarrow_json(body)
    if name == "duckdb read_json":
        return decode_duckdb(body_path)
    if name == "polars ndjson":
        return decode_polars(body)
    return decode_duckdb_tables(body_path)


def _child(name: str, trace: str, body_path: str) -> None:
    import stallscope.ingest.kineto.decode  # noqa: F401  (imports are not the decode's cost)

    data = Path(trace).read_bytes()
    gc.disable()  # as the decode does
    start = time.process_time()
    run_candidate(name, data, body_path)
    cpu = time.process_time() - start
    peak_mb = _peak_rss_mb()
    print(json.dumps({"cpu_s": cpu, "peak_mb": peak_mb}))


def _peak_rss_mb() -> float:
    """VmHWM: this process's own peak (ru_maxrss would carry the parent's over the exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def check(trace: Path, body_path: str) -> None:
    """The columnar candidates' ``ts`` in ns equal the current decode's, row for row."""
    import pyarrow.compute as pc

    from stallscope.ingest.kineto import decode

    data = trace.read_bytes()
    want = decode.decode_kineto("trace", data).events
    want = want.filter(pc.equal(want["ph"], "X"))["ts_fast_ns"].to_numpy()
    for name in ("pyarrow.json", "duckdb read_json"):
        got = run_candidate(name, data, body_path)
        got = got.filter(pc.equal(got["ph"], "X"))
        ns = got["ts_ns"] if "ts_ns" in got.column_names else _decimal_ns(got["ts"])
        same = len(ns) == len(want) and bool(np.array_equal(np.asarray(ns), want))
        print(f"{name}: {len(ns):,} X events, ts in ns equal to the current decode: {same}")
    if _has_polars():
        import polars as pl

        text = pl.concat(run_candidate("polars ndjson", data, body_path)).filter(
            pl.col("ph") == "X"
        )
        raw = [
            event.split(b'"ts":', 1)[1].split(b",", 1)[0].strip().decode()
            for event in map(bytes, msgspec.json.decode(events_array(data), type=list[msgspec.Raw]))
            if b'"ph": "X"' in event
        ]
        same = text["ts"].to_list() == raw
        print(f"polars ndjson: {len(text):,} X events, ts text as written: {same}")
        # This trace's ts are integers; Kineto's since 2023 have 3 decimals (ns), which polars
        # reads through a float64:
        line = b'{"ts": 1712195495519689.047}'
        got = pl.read_ndjson(io.BytesIO(line), schema={"ts": pl.String})["ts"][0]
        print(f"polars ndjson: {line.decode()} read as ts {got!r}")


def _has_polars() -> bool:
    try:
        import polars  # noqa: F401
    except ImportError:
        return False
    return True


def _decimal_ns(column: pa.ChunkedArray) -> np.ndarray:
    """decimal128(22, 3) µs -> int64 ns: the unscaled value is the nanoseconds."""
    array = column.combine_chunks()
    words = np.frombuffer(array.buffers()[1], dtype=np.int64)[2 * array.offset :]
    return words[0 : 2 * len(array) : 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="compare ts with the current decode")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--body", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, str(args.trace), args.body)
        return 0
    data = args.trace.read_bytes()
    mb = len(data) / 1e6
    with tempfile.NamedTemporaryFile(suffix=".json") as body_file:
        body_file.write(events_array(data))
        body_file.flush()
        del data
        if args.check:
            check(args.trace, body_file.name)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in CANDIDATES}
        for _ in range(args.runs):  # candidates alternate, so a busy spell hits them all
            for name in CANDIDATES:
                if name == "polars ndjson" and not _has_polars():
                    continue
                command = [sys.executable, __file__, str(args.trace), "--child", name]
                out = subprocess.run(
                    [*command, "--body", body_file.name],
                    capture_output=True,
                    text=True,
                    env={**os.environ, "STALLSCOPE_DECODE_WORKERS": "1"},  # CPU s of one process
                )
                if out.returncode:
                    sys.exit(f"{name}: {out.stderr.strip().splitlines()[-1]}")
                results[name].append(json.loads(out.stdout))
    print(f"{args.trace.name}: {mb:.1f} MB; medians of {args.runs} runs, largest peak\n")
    print("| candidate | CPU s | MB per CPU s | peak RSS MB | peak / file |")
    print("|---|---:|---:|---:|---:|")
    for name, runs in results.items():
        if not runs:
            continue
        cpu = statistics.median(r["cpu_s"] for r in runs)
        peak = max(r["peak_mb"] for r in runs)
        print(f"| {name} | {cpu:.2f} | {mb / cpu:.0f} | {peak:,.0f} | {peak / mb:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
