"""Build the hostile-input corpus in code: one small input per class of attack.

Each case is a function ``(folder) -> Path`` registered in :data:`CASES` with
the outcome ``stallscope ingest`` must give: the exit code and a fragment of
its one-line message (stderr for a refusal, stdout for an accepted input,
e.g. a warning). Accepted inputs must then analyze (exit 0 or 1).

Nothing here is committed as a binary: ``python -m tests.hostile.make_hostile
DIR`` writes the whole corpus to DIR (and prints the table); the tests build
each case in a temporary folder.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.kineto_builder import KinetoTrace
from tests.nsys_builder import NsysBuilder

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Case:
    """One hostile input and what ``stallscope ingest`` must do with it."""

    name: str
    build: Callable[[Path], Path]
    exit_code: int  # 0 accepted (then analyzable), 3 refused as bad input
    fragment: str  # in the one stderr line (refused) or in stdout (accepted)
    args: tuple[str, ...] = ()  # extra ingest arguments
    env: tuple[tuple[str, str], ...] = ()  # extra environment


def _kineto(rank: int | None = 0, world: int | None = 4, kernels: int = 4) -> KinetoTrace:
    t = KinetoTrace(rank=rank, world_size=world)
    t.step(1, 0, 1_000 * kernels)
    for i in range(kernels):
        t.kernel(f"kernel_{i}", 1_000 * i, 500)
    return t


def _header_edit(text: str, **info) -> str:
    head, rest = text.split(', "traceEvents": ', 1)
    header = json.loads(head + "}")
    header["distributedInfo"].update(info)
    return json.dumps(header)[:-1] + ', "traceEvents": ' + rest


def rank_huge(d: Path) -> Path:
    p = d / "rank_huge.pt.trace.json"
    p.write_text(_header_edit(_kineto().render(), rank=10**30))
    return p


def world_huge(d: Path) -> Path:
    p = d / "world_huge.pt.trace.json"
    p.write_text(_header_edit(_kineto().render(), world_size=10**7))
    return p


def rank_past_world(d: Path) -> Path:
    p = d / "rank_past_world.pt.trace.json"
    p.write_text(_header_edit(_kineto().render(), rank=9, world_size=4))
    return p


def kineto_far_times(d: Path) -> Path:
    """One kernel 290 years after the others: inside int64 ns, absurd as a trace span."""
    t = _kineto()
    t.kernel("far", 9 * 10**18, 500)
    p = d / "far_times.pt.trace.json"
    t.write(p)
    return p


def kineto_ts_overflow(d: Path) -> Path:
    """A timestamp past int64 once scaled to ns (10**17 µs)."""
    text = _kineto().render().replace('"ts": 3.000', '"ts": 100000000000000000000.5', 1)
    assert "100000000000000000000.5" in text
    p = d / "ts_overflow.pt.trace.json"
    p.write_text(text)
    return p


def negative_duration(d: Path) -> Path:
    t = _kineto()
    t.kernel("backwards", 5_000, -300)
    p = d / "negative_dur.pt.trace.json"
    t.write(p)
    return p


def utf8_bom(d: Path) -> Path:
    p = d / "bom.pt.trace.json"
    p.write_bytes(b"\xef\xbb\xbf" + _kineto().render().encode())
    return p


def deep_nesting(d: Path) -> Path:
    depth = 200_000
    text = '{"schemaVersion": 1, "traceEvents": [{"ph": "X", "args": ' + "[" * depth + "]" * depth
    p = d / "deep.pt.trace.json"
    p.write_text(text + ', "name": "k", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}')
    return p


def gzip_bomb(d: Path, ratio_size: int = 48 << 20) -> Path:
    """A gzip of whitespace-padded JSON, ~1000:1: no real trace compresses like this."""
    p = d / "bomb.pt.trace.json.gz"
    body = _kineto().render().encode()
    with gzip.open(p, "wb", compresslevel=9) as fh:
        fh.write(body[:-1])
        chunk = b" " * (1 << 20)
        for _ in range(ratio_size >> 20):
            fh.write(chunk)
        fh.write(b"}")
    return p


def gzip_500(d: Path, size: int = 3000 << 20) -> Path:
    """A ~500:1 gzip (6 MB expanding to ~3 GB): past the absolute cap for its size."""
    p = d / "ratio500.pt.trace.json.gz"
    body = _kineto().render().encode()
    filler = (b'{"ph": "i", "name": "x", "ts": 1, "pid": 1, "tid": 1, "s": "t"},' * 16)[:1024]
    # a little entropy per MiB keeps deflate near 500:1 instead of 1000:1
    import random

    rnd = random.Random(5)
    with gzip.open(p, "wb", compresslevel=6) as fh:
        fh.write(body.split(b'"traceEvents": [', 1)[0] + b'"traceEvents": [')
        for _ in range(size >> 20):
            noise = bytes(rnd.randrange(97, 123) for _ in range(400))
            fh.write(filler * 1023 + noise + b" " * (1024 - len(noise)) + b"\n")
        fh.write(body.split(b'"traceEvents": [', 1)[1])
    return p


def zip_many_ranks(d: Path, count: int = 4000) -> Path:
    p = d / "many_ranks.zip"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as zf:
        for r in range(count):
            zf.writestr(f"rank{r}.pt.trace.json", _kineto(rank=r, world=count, kernels=1).render())
    return p


def zip_big_members(d: Path, members: int = 40, member_mib: int = 60) -> Path:
    """Many members of ~60 MiB each (whitespace padded traces): fine one at a time."""
    p = d / "big_members.zip"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for r in range(members):
            body = _kineto(rank=r, world=members, kernels=2).render().encode()
            with zf.open(f"rank{r}.pt.trace.json", "w", force_zip64=True) as fh:
                fh.write(body[:-1])
                pad = b" " * (1 << 20)
                for _ in range(member_mib):
                    fh.write(pad)
                fh.write(b"}")
    return p


def _nsys(**kernel) -> NsysBuilder:
    b = NsysBuilder()
    b.process(100, "python", {100: "main"})
    b.gpu(0)
    b.kernel(100, 0, 7, kernel.get("start", 1_000), kernel.get("end", 2_000), 1, "gemm")
    b.kernel(100, 0, 7, 3_000, 4_000, 2, "gemm")
    return b


def nsys_int64_times(d: Path) -> Path:
    return _nsys(start=0, end=INT64_MAX).write(d / "int64.sqlite")


def nsys_recursive_view(d: Path) -> Path:
    p = _nsys().write(d / "recursive_view.sqlite")
    con = sqlite3.connect(p)
    con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO k_real")
    con.execute(
        "CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS WITH RECURSIVE r(n) AS "
        "(SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT k_real.* FROM k_real, r"
    )
    con.commit()
    con.close()
    return p


def nsys_trigger(d: Path) -> Path:
    p = _nsys().write(d / "trigger.sqlite")
    con = sqlite3.connect(p)
    con.execute("CREATE TRIGGER t AFTER INSERT ON CUPTI_ACTIVITY_KIND_KERNEL BEGIN SELECT 1; END")
    con.commit()
    con.close()
    return p


def nsys_corrupt(d: Path) -> Path:
    p = _nsys().write(d / "corrupt.sqlite")
    data = bytearray(p.read_bytes())
    for i in range(4096, len(data), 97):  # scribble over every page after the first
        data[i] = 0xA5
    p.write_bytes(bytes(data))
    return p


def nsys_bad_utf8(d: Path) -> Path:
    b = _nsys()
    p = b.write(d / "bad_utf8.sqlite")
    con = sqlite3.connect(p)
    con.execute("UPDATE StringIds SET value = CAST(X'67656D6DFF' AS TEXT) WHERE value = 'gemm'")
    con.commit()
    con.close()
    return p


def nsys_negative_duration(d: Path) -> Path:
    return _nsys(start=5_000, end=4_000).write(d / "negative.sqlite")


CASES: list[Case] = [
    Case("rank_huge", rank_huge, 3, "rank"),
    Case("world_huge", world_huge, 3, "world size"),
    Case("rank_past_world", rank_past_world, 3, "rank 9 is not below the world size 4"),
    Case("kineto_far_times", kineto_far_times, 3, "timestamps out of range"),
    Case(
        "kineto_ts_overflow", kineto_ts_overflow, 0, "dropped 1 events with unreadable timestamps"
    ),
    Case("negative_duration", negative_duration, 0, "1 events had a negative duration"),
    Case("utf8_bom", utf8_bom, 0, "ingested"),
    Case("deep_nesting", deep_nesting, 3, "nested too deeply"),
    Case("gzip_bomb", gzip_bomb, 3, "decompression bomb"),
    Case("zip_many_ranks", zip_many_ranks, 3, "more than the 1,024 ranks one job may hold"),
    Case("nsys_int64_times", nsys_int64_times, 3, "timestamps out of range"),
    Case("nsys_recursive_view", nsys_recursive_view, 3, "is a view"),
    Case("nsys_trigger", nsys_trigger, 3, "trigger"),
    Case("nsys_corrupt", nsys_corrupt, 3, "corrupt or unreadable SQLite database"),
    Case("nsys_bad_utf8", nsys_bad_utf8, 0, "not UTF-8"),
    Case("nsys_negative_duration", nsys_negative_duration, 0, "dropped 1 GPU activities"),
    Case(
        "timeout",
        lambda d: zip_many_ranks(d, 300),
        3,
        "ingest took longer than the 0.5 s limit",
        ("--timeout", "0.5"),
    ),
    Case(
        "memory_limit",
        lambda d: gzip_bomb(d, 200 << 20),
        3,
        "a third of the 400 MiB limit",
        ("--max-memory-mb", "400"),
        (("STALLSCOPE_DECOMPRESS_HEADROOM_MB", "4096"),),
    ),
    Case(
        "memory_kill",
        lambda d: _kineto(kernels=20_000).write(d / "big.pt.trace.json"),
        3,
        "ingest needed more than the 60 MiB memory limit",
        ("--max-memory-mb", "60"),
    ),
]
# Too big to build in every test run: the memory measurements (benchmarks/ and the report).
LARGE: dict[str, Callable[[Path], Path]] = {
    "gzip_500": gzip_500,
    "zip_big_members": zip_big_members,
}


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "hostile-corpus")
    out.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        path = case.build(out)
        print(f"{case.name:24} exit {case.exit_code}  {case.fragment!r:45} {path.name}")
    if "--large" in argv:
        for name, build in LARGE.items():
            print(f"{name:24} (large) {build(out).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
