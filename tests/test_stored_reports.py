"""Reports computed once and stored next to their job (stallscope.report_store): written at
ingest, reused by analyze and the dashboard, keyed by code and settings, never shown damaged,
removed with their job; and the dashboard's server never runs the analyzers itself."""

from __future__ import annotations

import json

import pytest

from stallscope import report_store
from stallscope.ingest import ingest_paths
from stallscope.report import build_report
from tests.test_utilization import hand_trace

NCCL_SKEW = {"nccl_wait": {"skew_tolerance_us": 250.0}}


@pytest.fixture
def job(store, tmp_path):
    """A hand-built one-rank job (tests/test_utilization.py: GPU 0 busy 75 of 100 µs, GPU 1 busy
    5 of 100 µs; steps of 10, 30 and 60 µs), ingested without a report."""
    (res,) = ingest_paths(store, [str(hand_trace().write(tmp_path / "hand.pt.trace.json"))])
    return res.job_id


@pytest.fixture
def no_analysis(monkeypatch):
    """Any analysis in this process fails the test (children are other processes)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the analyzers ran in this process")

    monkeypatch.setattr("stallscope.report.analyze_job", refuse)


def stored_keys(store, job_id: str) -> list[str]:
    folder = report_store.reports_dir(store, job_id)
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def default_key(store, job_id: str) -> str:
    return report_store.report_key(r.trace_id for r in store.traces(job_id))


def test_cli_ingest_stores_the_default_report(cli):
    from stallscope.store import Store

    trace = hand_trace().write(cli.store_dir.parent / "hand.pt.trace.json")
    done = cli("ingest", str(trace))
    assert done.returncode == 0, done.stderr
    assert "report of job" in done.stdout and "computed" in done.stdout
    store = Store(cli.store_dir)
    (job,) = store.jobs()
    key = default_key(store, job["job_id"])
    assert stored_keys(store, job["job_id"]) == [key]
    stored = report_store.load(store, job["job_id"], key)
    assert stored == build_report(store, [store.traces(job["job_id"])])
    summary = report_store.summarize(stored)
    listing = cli("ls").stdout  # ls shows the stored report's worst severity and step time
    assert f"{summary['worst_severity']} ({summary['worst_count']})  0.0 " in listing
    again = cli("ingest", str(trace))  # a re-upload: the report is already there
    assert again.returncode == 0 and "report of job" in again.stdout and "stored" in again.stdout
    skipped = cli("ingest", "--no-analyze", "--each", str(trace), str(trace))
    assert skipped.returncode == 0 and "report of job" not in skipped.stdout


def test_summary_is_known_by_hand(store, job):
    """Busy: (75 + 5) µs of 2 x 100 µs = 40 %; steps 10, 30, 60 µs: median 0.03 ms."""
    report, how = report_store.ensure(store, store.traces(job))
    assert how == "computed"
    summary = report_store.default_summary(store, job, [r.trace_id for r in store.traces(job)])
    assert summary["gpu_busy_pct"] == pytest.approx(40.0)
    assert summary["step_ms_median"] == pytest.approx(0.03)
    assert summary["tpot_ms"] is None  # a training job
    severities = [f["severity"] for f in report["findings"]]
    assert summary["findings"] == len(severities)
    assert summary["worst_count"] == severities.count(summary["worst_severity"]) >= 1


def test_analyze_reuses_the_stored_report(store, job, tmp_path, monkeypatch):
    from stallscope.cli import main

    first = tmp_path / "first.json"
    assert main(
        ["analyze", job, "--store", str(store.root), "--format", "json", "-o", str(first)]
    ) in (0, 1)
    assert stored_keys(store, job) == [default_key(store, job)]  # analyze stored it

    def refuse(*args, **kwargs):
        raise AssertionError("analyzed again")

    monkeypatch.setattr("stallscope.report.analyze_job", refuse)
    second = tmp_path / "second.json"
    assert main(
        ["analyze", job, "--store", str(store.root), "--format", "json", "-o", str(second)]
    ) in (0, 1)
    assert json.loads(second.read_text()) == json.loads(first.read_text())
    # --recompute reads nothing stored: it analyzes (here refused: the internal error, exit 70)
    assert (
        main(["analyze", job, "--store", str(store.root), "--recompute", "-o", str(second)]) == 70
    )


def test_a_settings_change_is_another_report(store, job):
    refs = store.traces(job)
    ids = [r.trace_id for r in refs]
    assert report_store.ensure(store, refs)[1] == "computed"
    assert report_store.ensure(store, refs, NCCL_SKEW)[1] == "computed"  # not the default's
    assert report_store.ensure(store, refs, NCCL_SKEW)[1] == "stored"
    assert report_store.ensure(store, refs)[1] == "stored"
    assert len(stored_keys(store, job)) == 2
    # an override equal to the default is the default
    same = {"nccl_wait": {"skew_tolerance_us": 100.0}}
    assert report_store.report_key(ids, same) == report_store.report_key(ids)


def test_settings_beyond_thresholds_are_in_the_key(store, job, monkeypatch):
    """A setting carried in the overrides that is no declared threshold (a regex), and an
    environment variable that sets one, each make another key."""
    ids = [r.trace_id for r in store.traces(job)]
    plain = report_store.report_key(ids)
    regex = {"inference": {"iteration_range": "decode_step"}}
    assert report_store.report_key(ids, regex) != plain
    assert report_store.report_key(ids, {"inference": {"iteration_range": " "}}) == plain
    monkeypatch.setenv(report_store.ANALYSIS_ENV[0], "decode_step")
    assert report_store.report_key(ids) not in (plain, report_store.report_key(ids, regex))


def test_a_version_or_code_change_is_another_report(store, job, monkeypatch, tmp_path):
    refs = store.traces(job)
    ids = [r.trace_id for r in refs]
    report_store.ensure(store, refs)
    key = report_store.report_key(ids)
    monkeypatch.setattr("stallscope.__version__", "9.9.9")
    assert report_store.report_key(ids) != key
    assert report_store.ensure(store, refs)[1] == "computed"
    monkeypatch.undo()
    # the code fingerprint follows the source files' content
    package = tmp_path / "fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rule.py").write_text("LIMIT = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(report_store, "CODE_PACKAGES", ("fakepkg",))
    before = report_store.code_fingerprint.__wrapped__()
    assert report_store.code_fingerprint.__wrapped__() == before
    (package / "rule.py").write_text("LIMIT = 2\n")
    assert report_store.code_fingerprint.__wrapped__() != before
    monkeypatch.setattr(report_store, "code_fingerprint", lambda: "other code")
    assert report_store.report_key(ids) != key


@pytest.mark.parametrize(
    "damage",
    ["flip a byte", "truncate", "garbage meta", "no report file", "meta of another key"],
)
def test_a_damaged_report_is_never_shown_and_is_replaced(store, job, damage):
    refs = store.traces(job)
    good, _ = report_store.ensure(store, refs)
    key = default_key(store, job)
    folder = report_store.reports_dir(store, job) / key
    data = (folder / "report.json").read_bytes()
    if damage == "flip a byte":
        at = data.index(b'"findings"') + 2
        (folder / "report.json").write_bytes(data[:at] + b"X" + data[at + 1 :])
    elif damage == "truncate":
        (folder / "report.json").write_bytes(data[: len(data) // 2])
    elif damage == "garbage meta":
        (folder / "meta.json").write_text("{not json")
    elif damage == "no report file":
        (folder / "report.json").unlink()
    else:
        meta = json.loads((folder / "meta.json").read_text())
        meta["key"] = "0" * 32
        (folder / "meta.json").write_text(json.dumps(meta))
    assert report_store.load(store, job, key) is None
    summary = report_store.default_summary(store, job, [r.trace_id for r in refs])
    if damage == "flip a byte":  # same size: only the hash (read by load) tells; the summary
        assert summary == report_store.summarize(good)  # comes from the intact meta.json
    else:
        assert summary is None
    again, how = report_store.ensure(store, refs)
    assert how == "computed" and again == good
    assert report_store.load(store, job, key) == good  # replaced by a whole one


def test_removing_the_job_removes_its_reports(cli, tmp_path):
    from stallscope.store import Store

    trace = hand_trace().write(tmp_path / "hand.pt.trace.json")
    assert cli("ingest", "--user", "ana", str(trace)).returncode == 0
    store = Store(cli.store_dir)
    (job,) = store.jobs()
    folder = report_store.reports_dir(store, job["job_id"])
    assert any(folder.iterdir())
    done = cli("rm", "--user", "ana", job["job_id"])
    assert done.returncode == 0, done.stderr
    assert not folder.exists() and not any(store.trash_dir.iterdir())


def test_a_report_is_written_atomically(store, job, monkeypatch):
    """A writer killed before the rename leaves only a staging folder: nothing stored, nothing read."""
    import os

    refs = store.traces(job)
    report = build_report(store, [refs])
    key = default_key(store, job)

    def killed(src, dst):
        raise KeyboardInterrupt  # as if killed between writing and publishing

    monkeypatch.setattr(os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        report_store.save(store, job, key, report)
    monkeypatch.undo()
    assert report_store.load(store, job, key) is None
    assert stored_keys(store, job) == []
    assert report_store.save(store, job, key, report)
    assert report_store.load(store, job, key) == report


def test_old_reports_are_pruned(store, job):
    refs = store.traces(job)
    for i in range(report_store.KEEP_PER_JOB + 2):
        report_store.ensure(store, refs, {"nccl_wait": {"skew_tolerance_us": 101.0 + i}})
    keys = stored_keys(store, job)
    assert len(keys) == report_store.KEEP_PER_JOB
    oldest = report_store.report_key(
        [r.trace_id for r in refs], {"nccl_wait": {"skew_tolerance_us": 101.0}}
    )
    assert oldest not in keys


def test_only_whole_jobs_are_stored(store, tmp_path):
    from tests.test_gpu_idle import hand_trace as idle_trace

    paths = [
        str(hand_trace().write(tmp_path / "rank0.json")),
        str(idle_trace().write(tmp_path / "rank1.json")),
    ]
    (res,) = ingest_paths(store, paths)
    refs = store.traces(res.job_id)
    assert len(refs) == 2
    assert report_store.ensure(store, refs[:1])[1] == "computed, not stored"
    assert stored_keys(store, res.job_id) == []


def test_report_child_builds_and_stores(store, job, no_analysis):
    from stallscope.report_child import report_in_child

    report = report_in_child(str(store.root), job)
    assert stored_keys(store, job) == [default_key(store, job)]
    assert report == report_store.load(store, job, default_key(store, job))
    changed = report_in_child(str(store.root), job, NCCL_SKEW)
    assert changed["findings"] is not None and len(stored_keys(store, job)) == 2


def test_report_child_failures_are_one_line(store, job, monkeypatch):
    from stallscope.errors import StallscopeError
    from stallscope.report_child import report_in_child

    with pytest.raises(StallscopeError, match=r"^no job 'feedbeef' in store") as err:
        report_in_child(str(store.root), "feedbeef")
    assert "\n" not in str(err.value)
    monkeypatch.setenv("STALLSCOPE_ANALYZE_TIMEOUT", "0.05")
    with pytest.raises(StallscopeError, match="took longer than 0.05 s and was stopped"):
        report_in_child(str(store.root), job)
    assert report_store.load(store, job, default_key(store, job)) is None


# -- the dashboard ---------------------------------------------------------------------
def _page(name: str, **query):
    from streamlit.testing.v1 import AppTest

    def script(page_name):
        import importlib

        importlib.import_module(f"stallscope.pages.{page_name}").render()

    at = AppTest.from_function(script, args=(name,), default_timeout=120)
    at.query_params.update(query)
    return at.run()


@pytest.fixture
def app_store(store, monkeypatch):
    import streamlit as st

    st.cache_data.clear()
    monkeypatch.setenv("STALLSCOPE_STORE", str(store.root))
    return store


def test_overview_reads_the_stored_report_and_never_analyzes(app_store, job, no_analysis):
    """With analyze_job refused in this (the server's) process: a stored report is shown; a
    missing one is built by a child process and stored; both without an exception."""
    with pytest.raises(AssertionError, match="the analyzers ran"):  # the refusal is armed
        build_report(app_store, [app_store.traces(job)])
    at = _page("overview", job=job)  # no stored report: a child builds it
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert stored_keys(app_store, job) == [default_key(app_store, job)]
    assert any(m.label == "GPU busy" and m.value == "40%" for m in at.metric)
    import streamlit as st

    st.cache_data.clear()
    at = _page("overview", job=job)  # stored: read
    assert not at.exception and any(m.label == "GPU busy" for m in at.metric)


def test_overview_with_changed_thresholds_uses_a_child(app_store, job, no_analysis):
    at = _page("overview", job=job)
    at.session_state["threshold_overrides"] = NCCL_SKEW
    at.run()
    assert not at.exception and not at.error
    assert len(stored_keys(app_store, job)) == 2


def test_a_failed_analysis_is_one_line_in_the_page(app_store, job, no_analysis, monkeypatch):
    monkeypatch.setenv("STALLSCOPE_ANALYZE_TIMEOUT", "0.05")
    at = _page("overview", job=job)
    assert not at.exception
    assert any("took longer than 0.05 s" in e.value for e in at.error)


def test_library_shows_stored_figures_and_never_analyzes(app_store, job, tmp_path, no_analysis):
    from tests.test_gpu_idle import hand_trace as idle_trace

    (other,) = ingest_paths(app_store, [str(idle_trace().write(tmp_path / "idle.pt.trace.json"))])
    from stallscope.report_child import report_in_child

    report_in_child(str(app_store.root), job)  # the hand job analyzed (by a child), the other not
    at = _page("library")
    assert not at.exception
    frame = at.dataframe[0].value.set_index("job")
    assert frame.loc[job, "step ms"] == pytest.approx(0.03)
    assert frame.loc[job, "GPU busy %"] == pytest.approx(40.0)
    assert frame.loc[job, "worst"].split(" ")[0] in ("critical", "high", "medium", "low", "info")
    assert frame.loc[other.job_id, "worst"] == "not analyzed yet"
    assert frame.loc[other.job_id, "step ms"] != frame.loc[other.job_id, "step ms"]  # NaN
    # numeric columns (sorted as numbers) with NaN, drawn as the dash placeholder, never as
    # Streamlit's "None" (an all-None column, e.g. ms/token of training jobs, was text)
    import json

    numbers = ("step ms", "GPU busy %", "ms/token")
    assert [str(frame[c].dtype) for c in numbers] == ["float64"] * 3
    assert frame["ms/token"].isna().all() and at.dataframe[0].proto.placeholder == "—"
    config = json.loads(at.dataframe[0].proto.columns)
    formats = {c: config[c]["type_config"].get("format") for c in numbers}
    # Streamlit's default: up to 4 decimals, trimmed (0.03 ms printed as 0.03, not as "%.1f" 0.0)
    assert formats == dict.fromkeys(numbers)
    assert stored_keys(app_store, other.job_id) == []  # listing analyzed nothing


def test_overview_agrees_with_the_library_on_a_sample(store):
    """On a real 2-rank sample the Library's step time and busy % are the Overview's."""
    from stallscope.charts import device_time_table
    from tests.conftest import SAMPLES

    folder = SAMPLES / "kineto" / "ddp_straggler"
    (res,) = ingest_paths(store, sorted(str(p) for p in folder.glob("*.json.gz")))
    report, _ = report_store.ensure(store, store.traces(res.job_id))
    summary = report_store.summarize(report)
    table = device_time_table(report)
    busy = (table["gpu_busy_pct"] * table["span_ms"]).sum() / table["span_ms"].sum()
    assert summary["gpu_busy_pct"] == pytest.approx(busy)
    medians = [
        m["value"]
        for m in report["metrics"]
        if m["name"] == "step_time_ms_median" and m["device"] is None
    ]
    assert summary["step_ms_median"] == pytest.approx(max(medians))
    assert summary["worst_severity"] == report["findings"][0]["severity"]


def test_serve_analyzes_the_preloaded_jobs_in_the_background(store, job):
    """The samples' reports are made by a detached process: serve does not wait for it."""
    import time

    from stallscope.report_child import analyze_missing_in_background

    ids = [r.trace_id for r in store.traces(job)]
    start = time.monotonic()
    analyze_missing_in_background(str(store.root))
    assert time.monotonic() - start < 5
    while report_store.default_summary(store, job, ids) is None and time.monotonic() - start < 180:
        time.sleep(0.5)
    assert report_store.default_summary(store, job, ids) is not None


def test_a_read_only_store_still_gives_the_report(store, job, monkeypatch):
    """Saving fails (read-only, full): the report computed is returned all the same."""
    import errno

    from stallscope.store import Lease

    def read_only(folder):
        raise OSError(errno.EROFS, "Read-only file system", str(folder))

    monkeypatch.setattr(Lease, "write", staticmethod(read_only))  # new_staging's first write
    report, how = report_store.ensure(store, store.traces(job))
    assert how == "computed, not stored" and report["findings"]
    assert stored_keys(store, job) == []


def test_overview_draws_a_findings_evidence_on_demand(app_store, job):
    """Evidence tables are drawn when a finding's toggle is switched on, not up front."""
    report_store.ensure(app_store, app_store.traces(job))
    at = _page("overview", job=job)
    assert not at.exception and at.toggle
    before = len(at.dataframe)
    at.toggle[0].set_value(True).run()
    assert not at.exception and len(at.dataframe) > before
