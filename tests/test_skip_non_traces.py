"""A directory or zip may hold files that are not traces: they are skipped (named in a
warning) and are no part of the job or its id; a broken trace still refuses the job."""

from __future__ import annotations

import gzip
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from stallscope.errors import InputError
from stallscope.ingest import ingest_paths, plan_jobs
from stallscope.ingest.reader import decompressed_head, expand_path
from stallscope.ingest.sniff import not_a_trace
from stallscope.store import Store
from tests.conftest import SAMPLES

RANKS = sorted((SAMPLES / "kineto" / "ddp_overlap").glob("rank*.pt.trace.json.gz"))
EXTRAS = {
    "meta.json": json.dumps({"run": 7, "gpus": 2, "commit": "abc123"}).encode(),
    "notes.yaml": b"lr: 0.1\nbatch: 64\n",
    "loss.csv": b"step,loss\n1,2.5\n2,2.1\n",
}


def _folder(root: Path, extras: dict[str, bytes]) -> Path:
    root.mkdir(parents=True)
    for rank in RANKS:
        shutil.copy(rank, root / rank.name)
    for name, data in extras.items():
        (root / name).write_bytes(data)
    return root


def _zip(path: Path, folder: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for file in sorted(folder.iterdir()):
            zf.write(file, f"run/{file.name}")
    return path


def _store(tmp_path: Path, name: str) -> Store:
    return Store(tmp_path / name).ensure()


@pytest.mark.parametrize("as_zip", [False, True], ids=["folder", "zip"])
def test_non_traces_are_skipped_named_and_not_part_of_the_job_id(tmp_path, as_zip):
    plain = _folder(tmp_path / "plain" / "run", {})
    mixed = _folder(tmp_path / "mixed" / "run", EXTRAS)
    if as_zip:
        plain, mixed = _zip(tmp_path / "plain.zip", plain), _zip(tmp_path / "mixed.zip", mixed)
    (alone,) = ingest_paths(_store(tmp_path, "a"), [str(plain)])
    (result,) = ingest_paths(_store(tmp_path, "b"), [str(mixed)])
    assert result.job_id == alone.job_id  # the extra files are no part of the identity
    assert len(result.trace_ids) == 2 and alone.warnings == []
    skipped = [w for w in result.warnings if "skipped" in w]
    assert len(skipped) == 3
    for name in EXTRAS:
        assert sum(name in w for w in skipped) == 1, (name, skipped)
    assert any("meta.json: skipped (JSON without any trace keys" in w for w in skipped)
    assert any("notes.yaml: skipped (a .yaml file, not a trace)" in w for w in skipped)
    assert any("loss.csv: skipped (CSV file" in w for w in skipped)
    # the same traces with the extras, into a store that has them: found, still warned
    store = _store(tmp_path, "a")
    (again,) = ingest_paths(store, [str(mixed)])
    assert again.existed and again.job_id == alone.job_id and len(again.warnings) == 3
    assert len(store.jobs()) == 1


def test_gzipped_non_trace_is_told_from_its_head(tmp_path):
    folder = _folder(tmp_path / "run", {"meta.json.gz": gzip.compress(EXTRAS["meta.json"])})
    ((name, sources, skipped),) = plan_jobs([str(folder)])
    assert [s.member for s in sources] == [r.name for r in RANKS]
    assert [s.short for s in skipped] == ["meta.json.gz"]


def test_head_of_a_gzip_bomb_costs_only_the_head(tmp_path):
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b"{" + b" " * (200 << 20)))  # 200 MiB of whitespace
    (source,) = expand_path(str(bomb))[1]
    head = decompressed_head(source, 1 << 20)
    assert head is not None and len(head) == 1 << 20 and head[:1] == b"{"
    assert source._raw is None  # never loaded whole
    assert not_a_trace(source) is not None  # an object with no trace key in its head


def test_trace_kinds_are_traces(tmp_path):
    for rank in RANKS:
        (source,) = expand_path(str(rank))[1]
        assert not_a_trace(source) is None
    bare = tmp_path / "events.json"
    bare.write_text('[{"ph": "X", "name": "k", "ts": 1, "dur": 2}]')
    assert not_a_trace(expand_path(str(bare))[1][0]) is None


def _truncated_trace(tmp_path: Path) -> bytes:
    data = gzip.decompress(RANKS[0].read_bytes())
    return data[: len(data) // 2]  # Kineto JSON cut in the middle


@pytest.mark.parametrize("as_zip", [False, True], ids=["folder", "zip"])
def test_a_broken_trace_beside_extras_still_refuses_the_job(cli, tmp_path, as_zip):
    folder = _folder(
        tmp_path / "run", {**EXTRAS, "rank9.pt.trace.json": _truncated_trace(tmp_path)}
    )
    target = _zip(tmp_path / "run.zip", folder) if as_zip else folder
    done = cli("ingest", str(target))
    assert done.returncode == 3, done.stderr
    assert "rank9.pt.trace.json" in done.stderr and "Traceback" not in done.stderr
    jobs = cli.store_dir / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir())


def test_folder_without_traces_is_refused_naming_what_it_skipped(cli, tmp_path):
    folder = tmp_path / "empty_run"
    folder.mkdir()
    (folder / "a.json").write_text('{"x": 1}')
    (folder / "b.txt").write_text("hello")
    done = cli("ingest", str(folder))
    assert done.returncode == 3
    assert done.stderr.strip().endswith("holds no traces (skipped: a.json, b.txt)"), done.stderr
    zipped = _zip(tmp_path / "empty.zip", folder)
    done = cli("ingest", str(zipped))
    assert done.returncode == 3
    assert "holds no traces (skipped: run/a.json, run/b.txt)" in done.stderr, done.stderr


def test_a_non_trace_given_directly_is_refused(cli, tmp_path):
    meta = tmp_path / "meta.json"
    meta.write_bytes(EXTRAS["meta.json"])
    done = cli("ingest", str(meta))
    assert done.returncode == 3 and "meta.json" in done.stderr
    csv = tmp_path / "loss.csv"
    csv.write_bytes(EXTRAS["loss.csv"])
    assert cli("ingest", str(csv)).returncode == 3


def test_cli_prints_the_skipped_files(cli, tmp_path):
    folder = _folder(tmp_path / "run", EXTRAS)
    done = cli("ingest", str(folder))
    assert done.returncode == 0, done.stderr
    assert "ingested: job" in done.stdout
    for name in EXTRAS:
        assert f"  warning: {folder / name}: skipped (" in done.stdout
    done = cli("ingest", "--json", str(_zip(tmp_path / "run.zip", folder)))
    (result,) = json.loads(done.stdout)
    assert result["existed"]
    assert {w.split(": skipped")[0] for w in result["warnings"]} == {
        f"{tmp_path / 'run.zip'}:run/{name}" for name in EXTRAS
    }


def test_junk_files_stay_silent(tmp_path):
    folder = _folder(tmp_path / "run", {".DS_Store": b"\x00\x01", ".hidden.json": b"{}"})
    ((_, sources, skipped),) = plan_jobs([str(folder)])
    assert len(sources) == 2 and skipped == []


def test_member_skipped_by_content_is_never_loaded(tmp_path):
    folder = _folder(tmp_path / "run", {"meta.json": EXTRAS["meta.json"]})
    ((_, sources, skipped),) = plan_jobs([str(_zip(tmp_path / "run.zip", folder))])
    assert [s.name.rsplit(":", 1)[-1] for s in skipped] == ["run/meta.json"]
    assert all(s._raw is None for s in sources)


def test_zip_of_notes_only_is_refused(tmp_path):
    path = tmp_path / "notes.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("README.md", "# run 7")
        zf.writestr("meta.json", EXTRAS["meta.json"])
    with pytest.raises(InputError, match=r"holds no traces \(skipped: README.md, meta.json\)"):
        plan_jobs([str(path)])


@pytest.mark.parametrize(
    "data",
    [b"", b"  \n", gzip.compress(gzip.compress(b"{}")), b"PK\x03\x04zipped", b"\xff\xfe{\x00"],
    ids=["empty", "blank", "gzip-twice", "nested-zip", "utf16"],
)
def test_packed_files_may_be_traces_and_refuse_the_job(tmp_path, data):
    folder = _folder(tmp_path / "run", {"rank5.pt.trace.json": data})
    with pytest.raises(InputError):
        ingest_paths(_store(tmp_path, "s"), [str(folder)])
    assert _store(tmp_path, "s").jobs() == []


def test_a_folder_of_thousands_of_files_is_refused_before_reading_them(tmp_path):
    folder = tmp_path / "home"
    folder.mkdir()
    for i in range(4097):
        (folder / f"f{i}.json").write_bytes(b"{}")
    with pytest.raises(InputError, match="holds 4,097 files"):
        plan_jobs([str(folder)])


@pytest.mark.parametrize(
    ("lead", "body", "is_trace"),
    [
        (b"", b'{"traceEvents": [', True),
        (b"\xef\xbb\xbf" + b" " * 4000, b'{"schemaVersion": 1, "traceEvents": [', True),
        (b"\n" * 5000, b'{"traceEvents": [', True),  # past the short head's 4 KiB of blanks
        (b"", b'{"run": 7, "note": "', False),  # no trace key in the first 64 KiB
        (b" " * 100, b'[{"ph": "X", "name": "', True),
    ],
)
def test_a_json_file_is_told_from_its_short_head_as_from_a_mib(tmp_path, lead, body, is_trace):
    """A file that starts as JSON is sniffed from 72 KiB, not 1 MiB: the answer is the same."""
    from stallscope.ingest import sniff

    path = tmp_path / "f.json"
    path.write_bytes(lead + body + b"x" * (2 << 20))  # longer than either head
    (source,) = expand_path(str(path))[1]
    assert (not_a_trace(source) is None) is is_trace
    long_head = decompressed_head(source, sniff.SNIFF_HEAD_BYTES)
    short_head = decompressed_head(source, sniff.JSON_HEAD_BYTES)
    assert sniff.json_decides(short_head) is (len(lead) <= 4096 + 3)
    assert (sniff.not_a_trace(source) is None) is (
        sniff.sniff(source.name, long_head) == "kineto"
        and any(key in long_head[: 1 << 16] for key in sniff._TRACE_KEYS)
    )
