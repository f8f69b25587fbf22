"""Self-checks for the fast paths in ingest/kineto/decode.py (exit 1 on a mismatch).

    python benchmarks/check_decode.py [TRACE.json ...]

1. ``plain_ns`` (µs text -> integer ns in NumPy) against the SQL conversion
   it shortcuts (``kineto.canonical._ns_sql``) on hand-picked and 50,000
   random spellings: wherever it gives a value, the value must be the same.
2. Piece size: each trace decoded with 64 KiB pieces and with the default
   must give equal tables, and the fast path must accept it.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import duckdb
import pyarrow as pa

from stallscope.ingest.kineto import canonical as kc
from stallscope.ingest.kineto import decode as kd
from stallscope.ingest.kineto import pieces as kp

HERE = Path(__file__).resolve().parent
SPELLINGS = [
    b"0", b"1", b"12", b"12.5", b"12.05", b"12.345", b"12.3456", b"", b'"12.5"', b"-1.25",
    b"1e3", b"1.5E+2", b"1669783687464181", b"1712195495519689.047", b"9223372036854775",
    b"9223372036854775.807", b"9223372036854775.808", b"9999999999999999.999",
    b"99999999999999999", b"null", b"true", b"0.001", b"0.5", b"007", b"1.", b".5", b"1.2.3",
    b"1.0", b"5.000", b"123456789012345.678", b"12345678901234567890123", b" 12", b"12 ",
]  # fmt: skip


def check_plain_ns() -> int:
    rnd = random.Random(1)
    values = list(SPELLINGS)
    for _ in range(50_000):
        text = str(rnd.randint(0, 10 ** rnd.randint(1, 18))).encode()
        if rnd.random() < 0.5:
            text += b"." + str(rnd.randint(0, 9999)).encode()[: rnd.randint(0, 4)]
        if rnd.random() < 0.05:
            text = text.replace(b"1", rnd.choice([b"-", b"x", b".", b" "]))
        values.append(text)
    column = kd.raw_text([memoryview(v) for v in values])
    con = duckdb.connect()
    con.register("t", pa.table({"x": column, "fast": kd.plain_ns(column)}))
    rows = con.sql(f"SELECT x, fast, {kc._ns_sql('x')} AS sql FROM t").fetchall()
    bad = [row for row in rows if row[1] is not None and row[1] != row[2]]
    fast = sum(row[1] is not None for row in rows)
    print(f"plain_ns: {fast:,} of {len(rows):,} converted in NumPy, {len(bad)} differ from SQL")
    for row in bad[:5]:
        print("  ", row)
    return len(bad)


def check_pieces(paths: list[Path]) -> int:
    problems = 0
    for path in paths:
        data = path.read_bytes()
        default = kd._decode_clean(data)
        saved, kp.CHUNK_BYTES = kp.CHUNK_BYTES, 1 << 16
        try:
            small = kd._decode_clean(data)
        finally:
            kp.CHUNK_BYTES = saved
        ok = (
            default is not None
            and small is not None
            and all(
                getattr(default, part).equals(getattr(small, part))
                for part in ("events", "gpu_args", "others")
            )
        )
        problems += not ok
        rows = default.events.num_rows if default else 0
        print(f"pieces: {path.name}: {rows:,} events, {'same' if ok else 'DIFFERENT or refused'}")
    return problems


def main() -> int:
    paths = [Path(p) for p in sys.argv[1:]] or sorted((HERE / "data").glob("*.json"))[:1]
    problems = check_plain_ns() + check_pieces(paths)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
