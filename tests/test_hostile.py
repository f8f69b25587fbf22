"""The hostile-input corpus (tests/hostile/make_hostile.py) through the real CLI.

Every refused input: the case's exit code, one stderr line holding its message
fragment, no traceback, nothing on stdout, and the store unchanged (the recursive
listing of a store that already holds a job). Every accepted input: its
fragment in the output, and the job then analyzes (exit 0 or 1) -- a trace that
passes ingest can always be analyzed.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from stallscope.ingest import ingest_paths
from stallscope.store import Store
from tests.hostile.make_hostile import CASES, Case, _kineto
from tests.test_bad_input import PREFIX, _snapshot


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile-template")
    seed = _kineto(rank=0).write(root / "seed.pt.trace.json")
    ingest_paths(Store(root / "store").ensure(), [str(seed)])
    return root / "store"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input(cli, template, tmp_path, case: Case):
    store = tmp_path / "store"
    shutil.copytree(template, store)
    before = _snapshot(store)
    path = case.build(tmp_path)
    out = cli(
        "ingest",
        *case.args,
        str(path),
        store=store,
        env={"TMPDIR": str(tmp_path), **dict(case.env)},
    )
    context = f"exit {out.returncode}, stdout={out.stdout[-500:]!r}, stderr={out.stderr[-2000:]!r}"
    assert out.returncode == case.exit_code, context
    assert "Traceback" not in out.stderr, context
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(("stallscope-", ".tmp"))]
    assert leftovers == [], f"temporary files left: {leftovers}"
    if case.exit_code != 0:
        lines = out.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(PREFIX), context
        assert case.fragment in lines[0], context
        assert out.stdout == ""
        assert _snapshot(store) == before, "a refused input changed the store"
        return
    assert case.fragment in out.stdout, context
    job_id = out.stdout.split("job ", 1)[1].split()[0]
    analyzed = cli("analyze", job_id, store=store)
    assert analyzed.returncode in (0, 1), analyzed.stderr
    assert "Traceback" not in analyzed.stderr


def test_corrupt_store_file_breaks_only_its_own_job(cli, tmp_path):
    store = Store(tmp_path / "store").ensure()
    jobs = []
    for rank in (0, 1):
        path = _kineto(rank=rank, kernels=3 + rank).write(tmp_path / f"job{rank}.pt.trace.json")
        jobs.append(ingest_paths(store, [str(path)])[0].job_id)
    broken = store.traces(jobs[0])[0].table_path("gpu")
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])  # truncated
    good = cli("analyze", jobs[1], store=store.root)
    assert good.returncode in (0, 1), good.stderr
    bad = cli("analyze", jobs[0], store=store.root)
    assert bad.returncode == 4, bad.stderr
    lines = bad.stderr.splitlines()
    assert len(lines) == 1, bad.stderr
    assert f"job {jobs[0]}: stored file {broken} is unreadable" in lines[0]
    assert f"stallscope rm {jobs[0]}" in lines[0]
    listed = cli("ls", store=store.root)
    assert listed.returncode == 0 and jobs[1] in listed.stdout


def test_corrupt_store_file_through_the_python_api(tmp_path):
    import stallscope
    from stallscope.errors import StoreFileCorrupt

    store = Store(tmp_path / "store").ensure()
    path = _kineto(rank=0).write(tmp_path / "a.pt.trace.json")
    job = stallscope.load(path, store=store)
    store.traces(job.job_id)[0].table_path("gpu").write_bytes(b"PAR1 not really")
    with pytest.raises(StoreFileCorrupt, match="is unreadable"):
        stallscope.load(job.job_id, store=store).report  # noqa: B018


def test_python_api_raises_input_errors(tmp_path):
    import stallscope
    from stallscope.errors import InputError
    from tests.hostile.make_hostile import deep_nesting, rank_huge

    store = Store(tmp_path / "store")
    for build in (deep_nesting, rank_huge):
        with pytest.raises(InputError):
            stallscope.load(build(tmp_path), store=store)


def test_disk_full_is_an_environment_error(tmp_path, monkeypatch, capfd):
    """ENOSPC while writing a job: exit 4, one line, store unchanged."""
    from stallscope import cli
    from stallscope.ingest import job as job_module

    path = _kineto(rank=0).write(tmp_path / "a.pt.trace.json")
    store = Store(tmp_path / "store").ensure()
    before = _snapshot(store.root)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(store.root / "staging"))

    monkeypatch.setattr(job_module, "_write_tables", full)
    code = cli.main(["ingest", "--store", str(store.root), str(path)])
    err = capfd.readouterr().err
    assert code == 4, err
    assert err.splitlines() == [
        f"stallscope: error: cannot write the store: no space left on the device (disk full) "
        f"({store.root / 'staging'})"
    ]
    assert _snapshot(store.root) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only folders")
def test_read_only_store_is_an_environment_error(cli, tmp_path):
    store = Store(tmp_path / "store").ensure()
    path = _kineto(rank=0).write(tmp_path / "a.pt.trace.json")
    for folder in (store.root, store.jobs_dir, store.staging_dir, store.trash_dir):
        folder.chmod(0o555)
    try:
        out = cli("ingest", str(path), store=store.root)
    finally:
        for folder in (store.root, store.jobs_dir, store.staging_dir, store.trash_dir):
            folder.chmod(0o755)
    assert out.returncode == 4, out.stderr
    assert "permission denied" in out.stderr and len(out.stderr.splitlines()) == 1


def test_a_job_removed_while_analyzed_is_not_found_not_a_crash(tmp_path):
    """`rm` racing `analyze`: the reader's traces vanish under it -> NotFoundError (exit 3)."""
    from stallscope.errors import NotFoundError
    from stallscope.report import job_report_part

    store = Store(tmp_path / "store").ensure()
    path = _kineto(rank=0).write(tmp_path / "a.pt.trace.json")
    job_id = ingest_paths(store, [str(path)])[0].job_id
    refs = store.traces(job_id)  # what analyze resolved ...
    store.delete_job(job_id)  # ... before rm removed the job
    with pytest.raises(NotFoundError, match=f"job {job_id} was removed while it was being read"):
        job_report_part(store, refs)


REFUSED = [c for c in CASES if c.exit_code != 0]
LIMIT_ENV = {"--timeout": "STALLSCOPE_INGEST_TIMEOUT", "--max-memory-mb": "STALLSCOPE_INGEST_MAX_MEMORY_MB"}  # fmt: skip


def _limits_as_env(case: Case) -> dict[str, str]:
    """The case's ingest options as the environment variables that set the same limits."""
    env = dict(case.env)
    for option, value in zip(case.args[::2], case.args[1::2], strict=True):
        env[LIMIT_ENV[option]] = value
    return env


@pytest.mark.parametrize("case", REFUSED, ids=[c.name for c in REFUSED])
def test_analyze_file_refuses_like_ingest(cli, template, tmp_path, case: Case):
    """`analyze FILE` ingests under the same limits as `ingest`: same exit code and line."""
    store = tmp_path / "store"
    shutil.copytree(template, store)
    before = _snapshot(store)
    path = case.build(tmp_path)
    out = cli(
        "analyze", *case.args, str(path), store=store, env={"TMPDIR": str(tmp_path), **dict(case.env)}
    )  # fmt: skip
    context = f"exit {out.returncode}, stdout={out.stdout[-500:]!r}, stderr={out.stderr[-2000:]!r}"
    assert out.returncode == case.exit_code, context
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX) and case.fragment in lines[0], context
    assert out.stdout == ""
    assert _snapshot(store) == before, "a refused input changed the store"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(("stallscope-", ".tmp"))]
    assert leftovers == [], f"temporary files left: {leftovers}"


@pytest.mark.parametrize("case", REFUSED, ids=[c.name for c in REFUSED])
def test_python_api_refuses_like_ingest(template, tmp_path, monkeypatch, case: Case):
    """`stallscope.load(FILE)` ingests in a child under the same limits (set by the
    environment): InputError with the same one line, the store unchanged."""
    import stallscope
    from stallscope.errors import InputError

    for name, value in {"TMPDIR": str(tmp_path), **_limits_as_env(case)}.items():
        monkeypatch.setenv(name, value)
    store = tmp_path / "store"
    shutil.copytree(template, store)
    before = _snapshot(store)
    path = case.build(tmp_path)
    with pytest.raises(InputError) as caught:
        stallscope.load(path, store=store)
    message = str(caught.value)
    assert case.fragment in message and "\n" not in message, message
    assert _snapshot(store) == before, "a refused input changed the store"


def test_trusted_python_api_ingests_in_process(tmp_path, monkeypatch):
    """trusted=True: no child process (the ingest runs here), the same errors for bad input."""
    import stallscope
    from stallscope import ingest_child
    from stallscope.errors import InputError
    from tests.hostile.make_hostile import deep_nesting

    def no_child(*args, **kwargs):
        raise AssertionError("a trusted load started a child process")

    monkeypatch.setattr(ingest_child, "ingest_in_child", no_child)
    store = Store(tmp_path / "store")
    job = stallscope.load(
        _kineto(rank=0).write(tmp_path / "a.pt.trace.json"), store=store, trusted=True
    )
    assert len(job.trace_ids) == 1
    with pytest.raises(InputError, match="nested too deeply"):
        stallscope.load(deep_nesting(tmp_path), store=store, trusted=True)
