"""The dashboard's ingest in a child process: results, progress, and every way the child can fail."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stallscope import ingest_child
from stallscope.errors import StallscopeError
from stallscope.report_store import default_summary
from stallscope.store import Store

SAMPLE = Path(__file__).resolve().parent.parent / "sample_traces" / "kineto" / "healthy"


def test_results_and_progress_come_back(tmp_path):
    updates = []
    root = str(tmp_path / "store")
    (first,) = ingest_child.ingest_in_child(
        root,
        [str(SAMPLE)],
        uploaded_by="ana",
        tags=["nightly"],
        progress=lambda *u: updates.append(u),
    )
    assert not first.existed and len(first.trace_ids) == 1
    assert [label.split(" ")[0] for label, _, _ in updates] == [
        "reading",
        "parsing",
        "writing",
        "publishing",
        "analyzing",  # the job's report, stored beside it (stallscope.report_store)
        "analyzed",
    ]
    (job,) = Store(root).jobs()
    assert job["uploaded_by"] == "ana" and job["tags"] == ["nightly"]
    assert default_summary(Store(root), first.job_id, first.trace_ids) is not None
    (again,) = ingest_child.ingest_in_child(root, [str(SAMPLE)])
    assert again.existed and again.job_id == first.job_id


def test_bad_file_gives_the_cli_one_line_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    with pytest.raises(StallscopeError) as err:
        ingest_child.ingest_in_child(str(tmp_path / "store"), [str(bad)])
    message = str(err.value)
    assert message.startswith(f"{bad}: truncated JSON") and "\n" not in message
    assert Store(str(tmp_path / "store")).jobs() == []


def test_a_killed_child_is_one_line_and_keeps_the_server(tmp_path, monkeypatch):
    """What the out-of-memory killer does to a huge upload: the caller gets a line, not a crash."""
    suicide = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    monkeypatch.setattr(
        ingest_child, "ingest_command", lambda *a, **k: [sys.executable, "-c", suicide]
    )
    with pytest.raises(StallscopeError, match=r"killed \(SIGKILL\): it probably ran out of memory"):
        ingest_child.ingest_in_child(str(tmp_path / "store"), [str(SAMPLE)])


@pytest.mark.parametrize(
    ("code", "lines", "expected"),
    [
        (3, ["stallscope: error: x.json: not a trace"], "x.json: not a trace"),
        (70, ["stallscope: internal error: KeyError: 'a' (set STALLSCOPE_DEBUG=1 for the traceback)"],
         "internal error: KeyError: 'a' (set STALLSCOPE_DEBUG=1 for the traceback)"),
        (1, [], "the ingest process exited with code 1"),
        (-15, [], "the ingest process was killed (SIGTERM); the store is unchanged"),
    ],
)  # fmt: skip
def test_failure_lines(code, lines, expected):
    assert ingest_child._failure(code, lines) == expected


def test_garbage_on_stdout_is_an_error_not_a_traceback(tmp_path, monkeypatch):
    monkeypatch.setattr(
        ingest_child, "ingest_command", lambda *a, **k: [sys.executable, "-c", "print('not json')"]
    )
    with pytest.raises(StallscopeError, match="unreadable result"):
        ingest_child.ingest_in_child(str(tmp_path / "store"), [str(SAMPLE)])


def test_the_child_runs_under_the_ingest_time_limit(tmp_path, monkeypatch):
    """The dashboard's child stops past $STALLSCOPE_INGEST_TIMEOUT with one clear line."""
    from tests.hostile.make_hostile import zip_many_ranks

    monkeypatch.setenv("STALLSCOPE_INGEST_TIMEOUT", "0.5")
    path = zip_many_ranks(tmp_path, 300)
    store = Store(tmp_path / "store")
    with pytest.raises(StallscopeError) as caught:
        ingest_child.ingest_in_child(str(store.root), [str(path)])
    message = str(caught.value)
    assert "ingest took longer than the 0.5 s limit" in message and "\n" not in message
    assert store.jobs() == [] and list(store.staging_dir.iterdir()) == []


def test_the_watchdog_kills_a_child_that_overruns(tmp_path, monkeypatch):
    """A child that never finishes on its own (here: a stopped one) is killed past the timeout."""
    monkeypatch.setenv("STALLSCOPE_INGEST_TIMEOUT", "0.2")
    monkeypatch.setattr(ingest_child, "WATCHDOG_GRACE_S", 0.5)
    monkeypatch.setattr(
        ingest_child,
        "ingest_command",
        lambda *a, **k: [sys.executable, "-c", "import time; time.sleep(60)"],
    )
    with pytest.raises(StallscopeError, match="took longer than 0.2 s and was stopped"):
        ingest_child.ingest_in_child(str(tmp_path / "store"), ["x.json"])


def test_a_job_that_cannot_be_analyzed_is_stored_with_a_warning(tmp_path, monkeypatch):
    """The report phase fails (here: the analyzers are broken in the child): the job is stored
    all the same, and the upload's result says why it has no report yet."""
    boot = tmp_path / "boot"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(
        "import stallscope.report as r\n"
        "def broken(*a, **k):\n"
        "    from stallscope.errors import StallscopeError\n"
        "    raise StallscopeError('analyzers broken for this test')\n"
        "r.analyze_job = broken\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{boot}:{__import__('os').environ.get('PYTHONPATH', '')}")
    root = str(tmp_path / "store")
    (result,) = ingest_child.ingest_in_child(root, [str(SAMPLE)])
    assert Store(root).has_job(result.job_id)
    assert default_summary(Store(root), result.job_id, result.trace_ids) is None
    assert any(
        "analyzers broken for this test" in w and "first opened" in w for w in result.warnings
    )
