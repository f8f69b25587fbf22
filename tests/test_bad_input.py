"""Bad input through the real CLI: one line naming the file and the reason, exit 3, store unchanged.

Every refusal is checked for both ``stallscope ingest`` and ``stallscope
analyze`` (which ingests its file arguments first), each against its own copy
of a store that already holds a job, so "unchanged" is a real check: the
recursive listing of the store folder (names, sizes, modification times) is
identical before and after. The two commands run side by side to keep this
file fast.

Inputs that are only *non-standard* (NaN, raw control characters, numbers past
int64, bad UTF-8) must ingest, with a warning that says what was repaired.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stallscope.ingest import ingest_paths
from stallscope.store import Store
from tests.kineto_builder import KinetoTrace

COMMANDS = ("ingest", "analyze")
PREFIX = "stallscope: error: "


def _trace(rank: int | None = 0, kernels: int = 20) -> KinetoTrace:
    t = KinetoTrace(rank=rank, world_size=4 if rank is not None else None)
    t.step(1, 0, 1_000 * kernels)
    for i in range(kernels):
        t.kernel(f"kernel_{i}", 1_000 * i, 500)
    return t


def _good(rank: int | None = 0, kernels: int = 20) -> bytes:
    return _trace(rank, kernels).render().encode()


def _snapshot(root: Path) -> list[tuple]:
    """Everything under the store folder, recursively: path, kind, size and mtime of files."""
    rows = []
    for p in sorted(root.rglob("*")):
        st = p.stat()
        rows.append((p.relative_to(root).as_posix(), p.is_dir(), 0 if p.is_dir() else st.st_size,
                     0 if p.is_dir() else st.st_mtime_ns))  # fmt: skip
    return rows


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A store already holding one good job; each CLI run gets its own copy."""
    root = tmp_path_factory.mktemp("template")
    seed = root / "seed.pt.trace.json"
    seed.write_bytes(_good(rank=0, kernels=3))
    ingest_paths(Store(root / "store").ensure(), [str(seed)])
    assert any((root / "store" / "jobs").iterdir())
    return root / "store"


def _run_both(cli, template: Path, tmp_path: Path, *args: str, env: dict | None = None):
    """Run ``ingest ARGS`` and ``analyze ARGS`` side by side, each on a fresh copy of the store."""

    def one(command: str):
        store = tmp_path / f"store-{command}"
        shutil.copytree(template, store)
        before = _snapshot(store)
        out = cli(command, *args, store=store, env=env)
        return command, out, before, _snapshot(store)

    with ThreadPoolExecutor(max_workers=len(COMMANDS)) as pool:
        return list(pool.map(one, COMMANDS))


def _check_refusal(command, out, before, after, *expected: str) -> str:
    context = f"{command}: exit {out.returncode}, stdout={out.stdout!r}, stderr={out.stderr!r}"
    assert out.returncode == 3, context
    assert "Traceback" not in out.stderr, context
    lines = out.stderr.splitlines()
    assert len(lines) == 1, context
    line = lines[0]
    assert line.startswith(PREFIX), context
    for text in expected:
        assert text in line, f"{text!r} not in {line!r}"
    assert out.stdout == "", context
    assert after == before, f"{command} changed the store"
    return line


def assert_refused(cli, template, tmp_path, args, *expected: str, env=None) -> list[str]:
    """Both commands exit 3 with one line holding every ``expected`` text; stores unchanged."""
    return [
        _check_refusal(*result, *expected)
        for result in _run_both(cli, template, tmp_path, *map(str, args), env=env)
    ]


# -- one bad file ------------------------------------------------------------------------


def _truncated_gzip(tmp: Path):
    blob = gzip.compress(_good())
    path = tmp / "cut.pt.trace.json.gz"
    path.write_bytes(blob[: len(blob) // 2])
    return path, ["truncated gzip file (the compressed stream ends early)"]


def _truncated_json(tmp: Path):
    text = _good()
    cut = text.rindex(b'"ts"')  # inside the last event
    path = tmp / "cut.pt.trace.json"
    path.write_bytes(text[:cut])
    return path, [
        f"truncated JSON: the document stops at byte {cut - 1:,}, after about 21 events",
        "cut off while being written or copied",
    ]


def _truncated_json_in_gzip(tmp: Path):
    text = _good()
    path = tmp / "cut_inside.pt.trace.json.gz"
    path.write_bytes(gzip.compress(text[: len(text) // 2]))  # a complete gzip of half a JSON
    return path, ["truncated JSON: the document stops at byte", "cut off while being written"]


def _truncated_with_zero_padding(tmp: Path):
    text = _good()
    cut = text.rindex(b"{")
    path = tmp / "crashed.pt.trace.json"
    path.write_bytes(text[:cut] + bytes(4096))  # a write interrupted by a crash
    return path, ["truncated JSON", "(then 4,097 blank or zero bytes)"]  # "\n" + 4,096 NULs


def _png(tmp: Path):
    path = tmp / "screenshot.json"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    return path, ["PNG image, not a trace"]


def _empty(tmp: Path):
    path = tmp / "empty.json"
    path.write_bytes(b"")
    return path, ["empty file"]


def _empty_gzip(tmp: Path):
    path = tmp / "empty.json.gz"
    path.write_bytes(gzip.compress(b""))
    return path, ["empty file"]


def _not_a_trace(tmp: Path):
    path = tmp / "config.json"
    path.write_text(json.dumps({"model": "resnet50", "batch_size": 32, "events": [1, 2]}))
    return path, ["JSON without a traceEvents array: not a Kineto trace"]


def _memory_timeline(tmp: Path):
    path = tmp / "memory_timeline.json"
    path.write_text(json.dumps([[1712195495519689, -1, 4096, 2], [1712195495519700, 1, 4096, 2]]))
    return path, ["PyTorch memory-timeline export, not a trace"]


def _binary(tmp: Path):
    rng = random.Random(7)
    path = tmp / "blob.json"
    path.write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    return path, ["binary data, not a JSON trace"]


def _bad_crc(tmp: Path):
    blob = bytearray(gzip.compress(_good()))
    blob[-8] ^= 0xFF  # the CRC-32 in the gzip trailer
    path = tmp / "damaged.json.gz"
    path.write_bytes(bytes(blob))
    return path, ["corrupt gzip file (checksum mismatch: the data is damaged)"]


def _invalid_json(tmp: Path):
    text = _good().replace(b'"kernel_3", ', b'"kernel_3",, ', 1)
    path = tmp / "broken.json"
    path.write_bytes(text)
    where = text.index(b",,") + 1
    return path, [f"invalid JSON at byte {where:,}: expected '\"'", "near '"]


def _empty_array(tmp: Path):
    path = tmp / "nothing.json"
    path.write_text("[]")
    return path, ["empty trace: no events with a time"]


def _metadata_only(tmp: Path):
    path = tmp / "metadata.pt.trace.json"
    meta = {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}}
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [meta]}))
    return path, ["empty trace: no events with a time"]


def _binary_named_sqlite(tmp: Path):
    rng = random.Random(9)
    path = tmp / "report.sqlite"
    path.write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    return path, ["not an SQLite database (no SQLite header), so not an Nsight Systems export"]


BAD_FILES = {
    "truncated_gzip": _truncated_gzip,
    "truncated_json": _truncated_json,
    "truncated_json_in_gzip": _truncated_json_in_gzip,
    "truncated_with_zero_padding": _truncated_with_zero_padding,
    "png_renamed_json": _png,
    "empty_file": _empty,
    "empty_gzip": _empty_gzip,
    "json_not_a_trace": _not_a_trace,
    "memory_timeline": _memory_timeline,
    "binary_file": _binary,
    "binary_named_sqlite": _binary_named_sqlite,
    "gzip_checksum": _bad_crc,
    "invalid_json": _invalid_json,
    "empty_array": _empty_array,
    "metadata_only": _metadata_only,
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_file_is_refused(cli, template, tmp_path, case):
    path, reasons = BAD_FILES[case](tmp_path)
    assert_refused(cli, template, tmp_path, [path], f"{PREFIX}{path}: ", *reasons)


def test_missing_file(cli, template, tmp_path):
    missing = tmp_path / "nowhere" / "rank0.pt.trace.json"
    ingest, analyze = _run_both(cli, template, tmp_path, str(missing))
    _check_refusal(*ingest, f"{PREFIX}{missing}: no such file or directory")
    _check_refusal(*analyze, str(missing))


def test_analyze_says_a_missing_file_is_missing(cli, template, tmp_path):
    missing = tmp_path / "rank0.pt.trace.json"
    _, analyze = _run_both(cli, template, tmp_path, str(missing))
    _check_refusal(*analyze, f"{PREFIX}{missing}: no such file or directory")


# -- decompression bombs and size limits ----------------------------------------------------


@pytest.fixture(scope="module")
def gzip_bomb(tmp_path_factory) -> Path:
    """70 KiB of gzip that expands to 70 MiB (deflate's best ratio, ~1030:1)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.pt.trace.json.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b" " * (1 << 20)
    parts = [packer.compress(b'{"traceEvents": [')]
    parts += [packer.compress(block) for _ in range(70)]
    parts.append(packer.compress(b"]}") + packer.flush())
    path.write_bytes(b"".join(parts))
    return path


def test_gzip_bomb_is_stopped_by_its_compression_ratio(cli, template, tmp_path, gzip_bomb):
    # Default size limit (16 GiB): only the ratio cap can stop it, at 100x + 32 MiB of output.
    assert gzip_bomb.stat().st_size < 100_000
    assert_refused(
        cli, template, tmp_path, [gzip_bomb],
        f"{PREFIX}{gzip_bomb}: ", "expands to more than", "(over 100x its size plus 32.0 MiB)",
        "a decompression bomb, not a trace",
    )  # fmt: skip


def test_gzip_over_the_size_limit(cli, template, tmp_path):
    # A few MB of output at a normal-looking ratio: stopped by STALLSCOPE_MAX_TRACE_BYTES.
    rng = random.Random(3)
    body = ",".join(
        json.dumps(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f"op{rng.randrange(10**6)}",
                "pid": 1,
                "tid": 1,
                "ts": i,
                "dur": 1,
            }
        )  # fmt: skip
        for i in range(40_000)
    )
    path = tmp_path / "big.pt.trace.json.gz"
    path.write_bytes(gzip.compress(('{"traceEvents": [' + body + "]}").encode(), 1))
    assert path.stat().st_size * 20 > len(body)  # not a bomb: an ordinary ratio (~11:1)
    assert_refused(
        cli, template, tmp_path, [path],
        f"{PREFIX}{path}: decompresses to more than the 1.0 MiB limit for one trace",
        "set STALLSCOPE_MAX_TRACE_BYTES to raise it",
        env={"STALLSCOPE_MAX_TRACE_BYTES": str(1 << 20)},
    )  # fmt: skip


def test_plain_file_over_the_size_limit(cli, template, tmp_path):
    path = tmp_path / "big.pt.trace.json"
    path.write_bytes(_good(kernels=50))
    assert_refused(
        cli, template, tmp_path, [path],
        f"{PREFIX}{path}: file is larger than the 4.0 KiB limit for one trace",
        env={"STALLSCOPE_MAX_TRACE_BYTES": "4096"},
    )  # fmt: skip


# -- jobs of several files: one bad file publishes nothing ---------------------------------


def test_directory_job_with_one_bad_file(cli, template, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    for rank in (0, 1, 3):
        (folder / f"rank{rank}.pt.trace.json").write_bytes(_good(rank=rank))
    bad = folder / "rank2.pt.trace.json"
    text = _good(rank=2)
    bad.write_bytes(text[: len(text) - 40])
    assert_refused(cli, template, tmp_path, [folder], f"{PREFIX}{bad}: truncated JSON")


def test_loose_files_with_one_bad_file(cli, template, tmp_path):
    good = tmp_path / "rank0.pt.trace.json"
    good.write_bytes(_good(rank=0))
    bad = tmp_path / "rank1.pt.trace.json"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n")
    assert_refused(cli, template, tmp_path, [good, bad], f"{PREFIX}{bad}: PNG image, not a trace")


def test_zip_job_with_one_bad_member(cli, template, tmp_path):
    path = tmp_path / "run.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("run/rank0.pt.trace.json", _good(rank=0))
        zf.writestr("run/rank1.pt.trace.json", b"")
    assert_refused(
        cli, template, tmp_path, [path], f"{PREFIX}{path}:run/rank1.pt.trace.json: empty file"
    )


# -- hostile zips ----------------------------------------------------------------------------


def _zip(path: Path, members: dict[str, bytes], level: int | None = None) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=level) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_zip_with_path_traversal(cli, template, tmp_path):
    path = _zip(tmp_path / "evil.zip", {"rank0.json": _good(rank=0), "../../x.json": _good(1)})
    assert_refused(
        cli, template, tmp_path, [path],
        f"{PREFIX}{path}: zip archive has an unsafe member path '../../x.json'",
        "refusing a hostile archive",
    )  # fmt: skip


def test_zip_with_absolute_member_path(cli, template, tmp_path):
    path = _zip(tmp_path / "evil.zip", {"/etc/cron.d/x.json": _good(rank=0)})
    assert_refused(
        cli, template, tmp_path, [path], f"{PREFIX}{path}: zip archive has an unsafe member path"
    )


def test_zip_with_too_many_members(cli, template, tmp_path):
    path = _zip(tmp_path / "many.zip", {f"r/{i}.json": b"{}" for i in range(4097)})
    assert_refused(
        cli, template, tmp_path, [path],
        f"{PREFIX}{path}: zip archive holds 4,097 entries (more than 4,096)",
    )  # fmt: skip


def test_zip_bomb(cli, template, tmp_path):
    path = _zip(tmp_path / "bomb.zip", {"rank0.json": b" " * (70 << 20)}, level=9)
    assert_refused(
        cli, template, tmp_path, [path],
        f"{PREFIX}{path}:rank0.json: ", "(over 100x its size plus a headroom)",
        "a zip bomb, not a trace",
    )  # fmt: skip


def test_zip_over_the_size_limit(cli, template, tmp_path):
    path = _zip(tmp_path / "big.zip", {"rank0.json": _good(0, 50), "rank1.json": _good(1, 50)})
    assert_refused(
        cli, template, tmp_path, [path],
        f"{PREFIX}{path}: zip archive expands to more than the 8.0 KiB limit for one trace",
        env={"STALLSCOPE_MAX_TRACE_BYTES": "8192"},
    )  # fmt: skip


def test_encrypted_zip_member(cli, template, tmp_path):
    blob = bytearray(_zip(tmp_path / "plain.zip", {"rank0.json": _good(0)}).read_bytes())
    # Set the "encrypted" flag bit, as a password-protected archive declares it, in the
    # local header (flags at offset 6) and the central directory entry (offset 8).
    blob[6] |= 0x1
    blob[blob.index(b"PK\x01\x02") + 8] |= 0x1
    path = tmp_path / "locked.zip"
    path.write_bytes(bytes(blob))
    assert_refused(
        cli, template, tmp_path, [path], f"{PREFIX}{path}:rank0.json: encrypted zip member"
    )


def test_corrupt_zip(cli, template, tmp_path):
    path = tmp_path / "bad.zip"
    path.write_bytes(b"PK\x03\x04" + bytes(200))
    assert_refused(cli, template, tmp_path, [path], f"{PREFIX}{path}: corrupt zip archive")


def test_zip_inside_zip(cli, template, tmp_path):
    inner = _zip(tmp_path / "inner.zip", {"rank0.json": _good(0)}).read_bytes()
    path = _zip(tmp_path / "outer.zip", {"inner.zip": inner})
    assert_refused(cli, template, tmp_path, [path], f"{PREFIX}{path}:inner.zip: nested zip archive")


# -- non-standard but readable: ingests with a warning -------------------------------------


def _ingest_ok(cli, path: Path) -> dict:
    out = cli("ingest", "--json", str(path))
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    (result,) = json.loads(out.stdout)
    return result


def _gpu_rows(cli, result: dict) -> list[dict]:
    (ref,) = Store(cli.store_dir).traces(result["job_id"])
    names = {r["name_id"]: r["name"] for r in pq.read_table(ref.table_path("names")).to_pylist()}
    rows = pq.read_table(ref.table_path("gpu")).to_pylist()
    for row in rows:
        row["name"] = names[row["name_id"]]
    return rows


def test_nan_and_infinity_ingest_with_a_warning(cli, tmp_path):
    text = _good().decode()
    text = text.replace('"blocks per SM": 0.5', '"blocks per SM": NaN', 1)
    text = text.replace('"warps per SM": 2.0', '"warps per SM": -Infinity', 1)
    path = tmp_path / "nan.pt.trace.json"
    path.write_text(text)
    result = _ingest_ok(cli, path)
    assert result["warnings"] == [
        f"{path}: repaired non-standard JSON: read 2 NaN/Infinity values as null"
    ]
    rows = {r["name"]: r for r in _gpu_rows(cli, result)}
    assert len(rows) == 20
    assert rows["kernel_0"]["blocks_per_sm"] is None and rows["kernel_0"]["warps_per_sm"] is None
    assert rows["kernel_1"]["blocks_per_sm"] == 0.5


def test_raw_control_characters_in_strings_ingest_with_a_warning(cli, tmp_path):
    text = _good().replace(b'"kernel_3"', b'"kernel\x01\x1f3"').replace(b'"kernel_4"', b'"k\t4"')
    path = tmp_path / "ctrl.pt.trace.json"
    path.write_bytes(text)
    result = _ingest_ok(cli, path)
    assert result["warnings"] == [
        f"{path}: repaired non-standard JSON: replaced 2 raw control characters with spaces"
    ]
    names = {r["name"] for r in _gpu_rows(cli, result)}
    assert {"kernel  3", "k 4"} <= names and len(names) == 20


def test_number_past_int64_in_args_ingests(cli, tmp_path):
    text = _good().replace(
        b'"registers per thread": 32', b'"registers per thread": 10159970886766084423', 1
    )
    text = text.replace(b'"shared memory": 0', b'"shared memory": -99999999999999999999999999', 1)
    path = tmp_path / "bigint.pt.trace.json"
    path.write_bytes(text)
    result = _ingest_ok(cli, path)
    assert result["warnings"] == []
    rows = {r["name"]: r for r in _gpu_rows(cli, result)}
    assert len(rows) == 20
    assert rows["kernel_0"]["registers_per_thread"] is None  # not representable: NULL, not wrapped
    assert rows["kernel_0"]["shared_mem_bytes"] is None
    assert rows["kernel_1"]["registers_per_thread"] == 32


def test_invalid_utf8_in_a_name_keeps_the_event(cli, tmp_path):
    # Kineto cuts long names at a byte count, sometimes inside a multibyte character.
    text = _good().replace(b'"kernel_5"', b'"kernel_\xc3"', 1)
    path = tmp_path / "utf8.pt.trace.json"
    path.write_bytes(text)
    result = _ingest_ok(cli, path)
    assert result["warnings"] == [f"{path}: replaced invalid UTF-8 bytes with U+FFFD in 1 events"]
    names = {r["name"] for r in _gpu_rows(cli, result)}
    assert "kernel_\ufffd" in names and len(names) == 20


def test_zero_padding_after_a_complete_trace_ingests(cli, tmp_path):
    path = tmp_path / "padded.pt.trace.json"
    path.write_bytes(_good() + bytes(1000))
    result = _ingest_ok(cli, path)
    assert len(_gpu_rows(cli, result)) == 20
    assert "repaired non-standard JSON" in result["warnings"][0]


# -- exact nanoseconds ----------------------------------------------------------------------


def test_microsecond_text_becomes_exact_nanoseconds(store, tmp_path):
    # 1712195495519689.047 µs is not exact in float64 (it would read ...689.0 -> ...689000 ns).
    event = ('{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
             '"ts": %s, "dur": %s, "args": {"device": 0, "stream": 7, "correlation": %d}}')  # fmt: skip
    events = [
        event % ("1712195495519689.047", "12.5", 1),
        event % ("1.712195495519690047e15", "0.001", 2),  # exponent form
        event % ('"1712195495519691.999"', '"1"', 3),  # numbers written as strings
    ]
    path = tmp_path / "exact.pt.trace.json"
    path.write_text('{"schemaVersion": 1, "traceEvents": [' + ", ".join(events) + "]}")
    (result,) = ingest_paths(store, [str(path)])
    (ref,) = store.traces(result.job_id)
    gpu = pq.read_table(ref.table_path("gpu")).sort_by("correlation")
    assert str(gpu.schema.field("start_ns").type) == "int64"
    assert gpu["start_ns"].to_pylist() == [
        1712195495519689047,
        1712195495519690047,
        1712195495519691999,
    ]
    assert gpu["end_ns"].to_pylist() == [
        1712195495519689047 + 12_500,
        1712195495519690047 + 1,
        1712195495519691999 + 1_000,
    ]


def test_trace_events_without_any_event_object_is_refused(cli, tmp_path):
    path = tmp_path / "ints.json"
    path.write_text('{"traceEvents": [1, 2, "x"]}')
    out = cli("ingest", str(path))
    assert out.returncode == 3
    assert (
        out.stderr.strip()
        == f"stallscope: error: {path}: not a Kineto trace: none of the 3 traceEvents entries is an event object"
    )


def test_sniff_names_each_registered_format_and_says_the_way_in():
    """Each format's file is named by its registered format; an ``nsys stats`` CSV is refused
    with the way in (ingest the report's SQLite export)."""
    from stallscope.errors import InputError
    from stallscope.ingest.sniff import sniff

    sqlite = b"SQLite format 3\x00" + b"\x00" * 100 + b"CREATE TABLE StringIds"
    for name, data, fmt in (
        ("r.nsys-rep", b"NVIDIA Tegra Profiler Report\x00", "nsys-rep"),
        ("r.qdrep", b"anything", "nsys-rep"),
        ("r.sqlite", sqlite, "nsys"),
        ("k.csv", b'"ID","Process ID","Process Name"\n', "ncu"),
        ("k.ncu-rep", b"NVR\x00rest", "ncu"),
        ("t.json", b'  {"traceEvents": []}', "kineto"),
    ):
        assert sniff(name, data) == fmt, name
    stats = b"Time (%),Total Time (ns),Instances,Avg (ns),Name\n12.5,1000,3,333,kernel\n"
    with pytest.raises(InputError, match="ingest the report's SQLite export instead"):
        sniff("stats.csv", stats)
    with pytest.raises(InputError, match="SQLite database, not a trace"):
        sniff("x.sqlite", b"SQLite format 3\x00" + b"\x00" * 200)
