"""Every file of the real-trace corpus (../shared/corpus) ingests, or fails with its true reason.

The corpus is real profiler output that nobody on this project wrote (see its
MANIFEST.md). Each Kineto-looking file either ingests with sane results,
checked against counts made independently with Python's ``json``, or is one of
:data:`EXPECTED_FAILURES` and fails with that specific one-line reason. The
files no parser reads (Nsight Systems reports without ``nsys`` to export them,
an ``nsys stats`` CSV) must fail through the CLI with exit code 3 and a reason
that tells the user what to do; the SQLite exports and ncu CSVs have their own
tests (test_nsys_corpus.py, test_ncu_ingest.py).
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from stallscope.errors import InputError
from stallscope.ingest import ingest_paths
from stallscope.store import Store
from tests.conftest import CORPUS, NO_CORPUS

pytestmark = [pytest.mark.corpus, pytest.mark.slow]
if not CORPUS.is_dir():
    pytest.skip(NO_CORPUS, allow_module_level=True)

# Kineto-looking files (JSON, possibly gzipped) and the Nsight / CSV files.
KINETO_SUFFIXES = (".json", ".json.gz", ".raw.gz")
OTHER_SUFFIXES = (".nsys-rep", ".qdrep", ".sqlite", ".csv", ".csv.gz")

# Corpus files that are not Kineto traces: path -> the reason they must fail with.
EXPECTED_FAILURES = {
    "hta/memory_analysis/memory_timeline.raw.gz": "PyTorch memory-timeline export, not a trace",
    "hta/execution_trace/benchmark_simple_add_et.json.gz": (
        "PyTorch Execution Trace (ET), not a Kineto trace"
    ),
}
# The only warning a clean corpus trace may carry.
NO_GPU_WARNING = "no GPU activity in this trace"


def _files(suffixes: tuple[str, ...]) -> list[str]:
    return sorted(
        p.relative_to(CORPUS).as_posix()
        for p in CORPUS.rglob("*")
        if p.is_file() and p.name.lower().endswith(suffixes)
    )


KINETO_FILES = _files(KINETO_SUFFIXES)
OTHER_FILES = _files(OTHER_SUFFIXES)


def independent_facts(path: Path) -> dict:
    """What the file holds, read with Python's json module (not stallscope's parser)."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw)
    events = doc if isinstance(doc, list) else doc["traceEvents"]
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    info = info if isinstance(info, dict) else {}
    return {
        "events": sum(1 for e in events if isinstance(e, dict) and e.get("ph") != "M"),
        "kernels": sum(
            1
            for e in events
            if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel")
        ),
        "rank": info.get("rank"),
        "world_size": info.get("world_size"),
    }


def ingest_one(rel: str, stores: str) -> dict:
    """Ingest one corpus file into a store of its own with ``ingest_paths`` (in a worker process).

    Returns the error (source, reason, message) or the catalog row, warnings and trace
    folder, plus the independent facts for files that ingest.
    """
    path = CORPUS / rel
    store = Store(Path(stores) / rel.replace("/", "__")).ensure()
    try:
        (result,) = ingest_paths(store, [str(path)])
    except InputError as exc:
        return {"error": (exc.source, exc.reason, str(exc)), "stored": len(store.traces())}
    (ref,) = store.traces(result.job_id)
    return {"error": None, "existed": result.existed, "warnings": result.warnings,
            "meta": ref.meta, "folder": str(ref.path), "facts": independent_facts(path)}  # fmt: skip


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    """Every Kineto-looking corpus file, ingested by a pool of processes as the tests go."""
    stores = tmp_path_factory.mktemp("corpus")
    pool = ProcessPoolExecutor(
        max_workers=max(2, os.cpu_count() or 2), mp_context=get_context("spawn")
    )
    futures = {rel: pool.submit(ingest_one, rel, str(stores)) for rel in KINETO_FILES}
    yield lambda rel: futures[rel].result(timeout=600)
    pool.shutdown(cancel_futures=True)


def _input_error(out) -> str:
    """The CLI's single stderr line for an input error (exit 3, no traceback)."""
    assert out.returncode == 3, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("stallscope: error: ")
    return lines[0]


def test_corpus_is_fully_classified():
    everything = sorted(
        p.relative_to(CORPUS).as_posix()
        for p in CORPUS.rglob("*")
        if p.is_file() and p.name != "MANIFEST.md"
    )
    assert sorted(KINETO_FILES + OTHER_FILES) == everything, "a corpus file of a new kind"
    assert set(EXPECTED_FAILURES) <= set(KINETO_FILES), "EXPECTED_FAILURES names a missing file"
    assert len(KINETO_FILES) >= 60


@pytest.mark.parametrize("rel", KINETO_FILES)
def test_kineto_file_ingests_or_fails_with_its_reason(ingested, rel):
    path = CORPUS / rel
    out = ingested(rel)
    if rel in EXPECTED_FAILURES:
        assert out["error"] is not None, f"{rel} should fail: {EXPECTED_FAILURES[rel]}"
        source, reason, message = out["error"]
        assert source == str(path)
        assert "\n" not in message
        assert EXPECTED_FAILURES[rel] in reason
        assert out["stored"] == 0
        return

    assert out["error"] is None, out["error"]
    meta, expected = out["meta"], out["facts"]
    assert not out["existed"]
    assert meta["source"] == "kineto"
    assert meta["event_count"] > 0
    assert meta["event_count"] == expected["events"]  # every non-metadata event
    kernels = expected["kernels"]
    assert meta["kernel_count"] == kernels
    assert [w for w in out["warnings"] if NO_GPU_WARNING not in w] == []

    folder = Path(out["folder"])
    gpu = pq.read_table(folder / "gpu.parquet")
    host = pq.read_table(folder / "host.parquet")
    for table in (gpu, host):
        assert table.schema.field("start_ns").type == pa.int64()
        assert table.schema.field("end_ns").type == pa.int64()
    assert (pc.sum(pc.equal(gpu["kind"], "kernel")).as_py() or 0) == kernels
    if gpu.num_rows:
        assert gpu["start_ns"].null_count == 0 and gpu["end_ns"].null_count == 0
        assert pc.all(pc.greater_equal(gpu["end_ns"], gpu["start_ns"])).as_py()
        assert meta["span_ns"] >= 0

    if isinstance(expected["rank"], int):
        assert meta["rank"] == expected["rank"]
        if isinstance(expected["world_size"], int) and expected["world_size"] > 0:
            assert meta["world_size"] == expected["world_size"]


def test_dlrm_eight_ranks_as_one_job(store):
    paths = sorted(str(p) for p in (CORPUS / "param" / "dlrm_kineto").glob("worker*.json.gz"))
    assert len(paths) == 8
    (result,) = ingest_paths(store, paths)
    refs = store.traces(result.job_id)
    assert len(refs) == len(result.trace_ids) == 8
    assert sorted(r.meta["rank"] for r in refs) == list(range(8))
    assert {r.meta["world_size"] for r in refs} == {8}
    for ref in refs:
        collectives = pq.read_table(ref.table_path("collectives"))
        assert collectives.num_rows == 8, ref.meta["file_name"]
        assert set(collectives["rank"].to_pylist()) == {ref.meta["rank"]}
    assert len(store.jobs()) == 1


def test_sampled_pair_as_one_job(store):
    paths = [str(CORPUS / "hta" / "trace_filter" / f"sampled_rank-{r}.json.gz") for r in (0, 1)]
    (result,) = ingest_paths(store, paths)
    refs = store.traces(result.job_id)
    assert sorted(r.meta["rank"] for r in refs) == [0, 1]
    assert {r.meta["world_size"] for r in refs} == {128}  # 2 of 128 ranks, as recorded


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_two_files_without_rank_info_fail(cli):
    # Neither has distributedInfo.rank, neither name carries a rank.
    a = CORPUS / "hta" / "rank_unavailable" / "rank_not_found.json.gz"
    b = CORPUS / "hta" / "distributed_info_unavailable" / "distributed_info_not_found.json.gz"
    line = _input_error(cli("ingest", str(a), str(b)))
    assert "cannot tell this file's rank" in line
    assert str(a) in line or str(b) in line
    assert not any(cli.store_dir.glob("jobs/*"))
    assert not any(cli.store_dir.glob("staging/*"))


def test_two_files_claiming_one_rank_fail(cli):
    a = CORPUS / "hta" / "trace_compare" / "base" / "base.json.gz"  # rank 1
    b = CORPUS / "hta" / "trace_compare" / "test" / "test.json.gz"  # rank 1 as well
    line = _input_error(cli("ingest", str(a), str(b)))
    assert "rank 1 is also claimed by" in line
    assert str(a) in line and str(b) in line
    assert not any(cli.store_dir.glob("jobs/*"))
    assert not any(cli.store_dir.glob("staging/*"))


# Corpus files of other formats that ingest: their own tests read them
# (tests/test_nsys_corpus.py: the SQLite exports; tests/test_ncu_ingest.py: the ncu CSVs).
INGESTED_ELSEWHERE = (".sqlite", ".csv.gz", "nsightful/copy_blocked.csv")
REFUSED_FILES = [rel for rel in OTHER_FILES if not rel.lower().endswith(INGESTED_ELSEWHERE)]


def _refusal(rel: str, path: Path) -> list[str]:
    """What the refusal of a corpus file that cannot be ingested must say."""
    lower = rel.lower()
    if lower.endswith((".nsys-rep", ".qdrep")):
        # The binary report needs exporting: the exact command, with the path as given.
        stem = str(path).rsplit(".", 1)[0]
        command = (
            f"nsys export --type sqlite -o {shlex.quote(stem + '.sqlite')} {shlex.quote(str(path))}"
        )
        return ["Nsight Systems report", command]
    if lower == "pipit/nbody-nvtx/trace.csv":
        return [
            "Nsight Systems 'nsys stats' CSV report, not a trace: "
            "ingest the report's SQLite export instead (nsys export --type sqlite)"
        ]
    raise AssertionError(f"no expected reason for {rel}")


@pytest.fixture(scope="module")
def refused_results(tmp_path_factory):
    """``stallscope ingest FILE`` for every corpus file that must be refused."""
    root = tmp_path_factory.mktemp("other")

    def run(rel: str):
        env = dict(os.environ, STALLSCOPE_STORE=str(root / rel.replace("/", "_")))
        command = [sys.executable, "-m", "stallscope.cli", "ingest", str(CORPUS / rel)]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = dict(zip(REFUSED_FILES, pool.map(run, REFUSED_FILES), strict=True))
    return root, results


@pytest.mark.parametrize("rel", REFUSED_FILES)
def test_unreadable_files_fail_with_a_clear_reason(refused_results, rel):
    if rel.endswith((".nsys-rep", ".qdrep")) and _nsys_on_path():
        pytest.skip("nsys is installed here: the report may be exported and ingested")
    root, results = refused_results
    path = CORPUS / rel
    reasons = _refusal(rel, path)
    line = _input_error(results[rel])
    assert line.startswith(f"stallscope: error: {path}: {reasons[0]}"), line
    for reason in reasons[1:]:
        assert reason in line, line
    assert not any((root / rel.replace("/", "_")).glob("jobs/*"))


def _nsys_on_path() -> bool:
    return bool(os.environ.get("STALLSCOPE_NSYS") or shutil.which("nsys"))


def test_corpus_matches_its_manifest():
    """tests/corpus_manifest.json declares every corpus file (path, size, sha256), unchanged."""
    from tests.conftest import CORPUS_MANIFEST, corpus_problems

    declared = {e["path"] for e in json.loads(CORPUS_MANIFEST.read_text())["files"]}
    on_disk = {p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*") if p.is_file()}
    assert declared == on_disk - {"MANIFEST.md"}
    assert corpus_problems() == []


def test_a_missing_or_changed_corpus_file_is_reported(tmp_path):
    from tests.conftest import corpus_problems

    root = tmp_path / "corpus"
    root.mkdir()
    (root / "a.json").write_text("[]")
    (root / "b.json").write_text("{}")
    entries = [{"path": "a.json", "size": 2, "sha256": "0" * 64},
               {"path": "b.json", "size": 2, "sha256": "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"},
               {"path": "c.json", "size": 1, "sha256": "0" * 64}]  # fmt: skip
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"files": entries}))
    assert corpus_problems(root, manifest) == ["changed content: a.json", "missing: c.json"]
    assert corpus_problems(tmp_path / "absent", manifest)[0].startswith("trace corpus not found")
