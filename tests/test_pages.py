"""Every dashboard page renders against a real store (streamlit's AppTest)."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from stallscope.ingest import ingest_paths
from stallscope.report_store import store_default_reports
from tests.test_gpu_idle import hand_trace as idle_trace
from tests.test_utilization import hand_trace


@pytest.fixture(autouse=True)
def fresh_caches():
    """Each test has its own store; page caches are per server (one store) in real use."""
    import streamlit as st

    st.cache_data.clear()
    yield


@pytest.fixture
def app_store(store, tmp_path, monkeypatch):
    ingest_paths(
        store,
        [str(hand_trace().write(tmp_path / "hand.pt.trace.json"))],
        tags=["demo"],
        uploaded_by="ana",
    )
    ingest_paths(
        store,
        [str(idle_trace().write(tmp_path / "idle.pt.trace.json"))],
        tags=["other"],
        uploaded_by="bo",
    )
    # as `stallscope ingest` does: each job's report stored beside it (the pages read it)
    store_default_reports(store, [j["job_id"] for j in store.jobs()])
    monkeypatch.setenv("STALLSCOPE_STORE", str(store.root))
    return store


def page(name: str, **query) -> AppTest:
    def script(page_name):
        import importlib

        importlib.import_module(f"stallscope.pages.{page_name}").render()

    at = AppTest.from_function(script, args=(name,), default_timeout=60)
    at.query_params.update(query)
    return at.run()


def job_id(store, name: str) -> str:
    return next(j["job_id"] for j in store.jobs() if j["name"] == name)


def test_library_lists_and_filters_jobs(app_store):
    at = page("library")
    assert not at.exception
    frame = at.dataframe[0].value
    assert set(frame["name"]) == {"hand.pt.trace.json", "idle.pt.trace.json"}
    at.text_input(key="search").set_value("ana").run()  # search by uploader
    assert list(at.dataframe[0].value["name"]) == ["hand.pt.trace.json"]


def test_overview_headline_and_findings(app_store):
    at = page("overview", job=job_id(app_store, "hand.pt.trace.json"))
    assert not at.exception
    labels = [m.label for m in at.metric]
    assert labels[0].startswith("Step time") and "GPU busy" in labels
    titles = [e.label for e in at.expander]
    titles = [t.replace("\\", "") for t in titles]
    # the two GPUs' headlines are one entry, led by the idler GPU
    assert any("GPU 1 busy 5.0%, idle 95.0%" in t and "and 1 more" in t for t in titles)
    assert not any("GPU 0 busy 75.0%" in t for t in titles)


def test_overview_deep_link_by_trace_id(app_store):
    (ref,) = app_store.traces(job_id(app_store, "idle.pt.trace.json"))
    at = page("overview", trace=ref.trace_id)
    assert not at.exception
    assert at.sidebar.selectbox[0].value == ref.job_id


def test_unknown_job_in_a_link_says_so(app_store):
    at = page("overview", job="doesnotexist")
    assert not at.exception
    assert any("No job 'doesnotexist' in this store" in w.value for w in at.warning)


def test_overview_of_a_job_with_a_damaged_file_says_so_in_one_line(app_store):
    """One corrupt Parquet file breaks only its own job's pages, with a clear message."""
    broken = job_id(app_store, "hand.pt.trace.json")
    path = app_store.traces(broken)[0].table_path("gpu")
    path.write_bytes(path.read_bytes()[:100])
    import shutil

    from stallscope.report_store import reports_dir

    shutil.rmtree(reports_dir(app_store, broken))  # no stored report: it is analyzed (in a child)
    at = page("overview", job=broken)
    assert not at.exception
    assert any(f"job {broken}: stored file {path} is unreadable" in e.value for e in at.error)
    other = page("overview", job=job_id(app_store, "idle.pt.trace.json"))
    assert not other.exception and not other.error


def test_timeline_draws_the_window(app_store):
    (ref,) = app_store.traces(job_id(app_store, "idle.pt.trace.json"))
    at = page("timeline", trace=ref.trace_id, window="0-60000")
    assert not at.exception
    assert len(at.get("plotly_chart")) == 1
    assert at.query_params["window"] == ["0-60000"] or at.query_params["window"] == "0-60000"


def test_timeline_shows_every_rank_and_search_zooms_to_a_match(ddp_store):
    at = page("timeline")
    assert not at.exception
    assert at.sidebar.multiselect[0].value == [0, 1]  # 2 ranks: all of them
    (chart,) = at.get("plotly_chart")
    import json

    ticks = json.loads(chart.proto.spec)["layout"]["yaxis"]["ticktext"]
    assert any(t.startswith("rank 0 · GPU 0") for t in ticks)
    assert any(t.startswith("rank 1 · GPU 1") for t in ticks)
    before = at.query_params["window"]
    at.text_input(key="tl_search").set_value("ncclDevKernel").run()
    at.radio(key="tl_in").set_value("the whole trace").run()
    match = at.selectbox(key="tl_match")
    assert match.label.startswith("Matches (") and len(match.options) > 1
    match.select_index(1).run()
    assert not at.exception
    window = at.query_params["window"]
    window = window[0] if isinstance(window, list) else window
    assert window != before
    start, end = (int(x) for x in window.split("-"))
    assert end - start < 50_000_000  # zoomed in around the match
    assert at.subheader[0].value.startswith("Selected: ncclDevKernel")
    assert any("launch -> start µs" in d.value.columns for d in at.dataframe)


def test_timeline_says_when_the_ranks_first_steps_are_apart(store, tmp_path, monkeypatch):
    from tests.kineto_builder import KinetoTrace

    paths = []
    for rank, start in ((0, 0), (1, 2_500_000)):  # rank 1's first step 2.5 ms later
        t = KinetoTrace(rank=rank, world_size=2)
        t.step(0, start, 1_000_000)
        t.kernel("k", start + 100_000, 500_000, device=rank)
        paths.append(str(t.write(tmp_path / f"rank{rank}.pt.trace.json")))
    ingest_paths(store, paths)
    monkeypatch.setenv("STALLSCOPE_STORE", str(store.root))
    at = page("timeline")
    assert not at.exception
    assert any("first steps start 2.500 ms apart" in c.value for c in at.caption)
    at.sidebar.multiselect[0].set_value([1]).run()  # one rank: nothing to compare
    assert not any("apart" in c.value for c in at.caption)
    assert at.query_params["ranks"] in ("1", ["1"])


def test_compare_two_jobs(app_store):
    at = page("compare")
    assert not at.exception
    titles = [h.value for h in at.subheader]  # the CLI's tables, in its order
    assert titles[0] == "Step time" and titles[1].startswith("Where one GPU's step goes")
    for title in ("Time by cause", "Communication", "Copies by kind", "Kernels", "Findings"):
        assert any(t.startswith(title) for t in titles), title
    assert len(at.dataframe) >= 4  # step time, where the step goes, time by cause, kernels
    # the CLI's verdict, stated first
    verdicts = [m.value for m in (*at.info, *at.error, *at.success)]
    assert any(
        v.startswith(("**NO SIGNIFICANT CHANGE**", "**REGRESSION**", "**IMPROVEMENT**"))
        for v in verdicts
    )


def test_sql_runs_and_refuses_files(app_store):
    at = page("sql")
    tables = at.dataframe[0].value  # the tables and their columns, for writing queries
    assert "start_ns" in tables.set_index("table").loc["gpu", "columns"]
    assert any("Loaded: 2 jobs" in c.value for c in at.caption)
    at.text_area[0].set_value("SELECT count(*) AS n FROM gpu").run()
    at.button[0].click().run()
    assert not at.exception and int(at.dataframe[-1].value["n"][0]) > 0
    at.text_area[0].set_value("SELECT * FROM read_csv('/etc/passwd')").run()
    at.button[0].click().run()
    assert at.error and "read_csv() is not available" in at.error[0].value


def _app():
    from stallscope.pages.main import main

    main()


def test_token_without_the_gate_keeps_the_dashboard_closed(app_store, monkeypatch):
    """`streamlit run pages/entry.py` with a token: no HTTP gate, so nothing is shown."""
    from stallscope.pages import gate

    monkeypatch.setattr(gate, "_KEEPER", None)
    monkeypatch.setenv("STALLSCOPE_TOKEN", "s3cret")
    at = AppTest.from_function(_app, default_timeout=60).run()
    assert not at.exception and "without the access gate" in at.error[0].value
    assert not at.dataframe and not at.text_input  # nothing of the store, no form


def test_page_gate_needs_a_valid_session_cookie(app_store, monkeypatch, tmp_path):
    from stallscope.access import Settings
    from stallscope.pages import gate, main

    monkeypatch.setattr(gate, "_KEEPER", None)
    gate.install(tmp_path / "key", Settings(token="s3cret"))
    signer = gate.current().signer
    for cookie in (None, "forged", signer.issue(lifetime_s=-1)):  # none, bad, expired
        monkeypatch.setattr(main, "session_cookie", lambda c=cookie: c)
        at = AppTest.from_function(_app, default_timeout=60).run()
        assert not at.exception and "session has ended" in at.warning[0].value
        assert not at.dataframe
    monkeypatch.setattr(main, "session_cookie", lambda: signer.issue(lifetime_s=3600))
    at = AppTest.from_function(_app, default_timeout=60).run()
    assert not at.exception and at.dataframe  # the library's job table
    assert any("Your upload quota: 0 of 4,096 MB" in c.value for c in at.caption)


@pytest.fixture
def ddp_store(store, monkeypatch):
    from tests.conftest import SAMPLES

    folder = SAMPLES / "kineto" / "ddp_straggler"
    ingest_paths(store, [str(p) for p in sorted(folder.glob("*.pt.trace.json.gz"))])
    monkeypatch.setenv("STALLSCOPE_STORE", str(store.root))
    return store


def test_kernels_page(ddp_store):
    at = page("kernels")
    assert not at.exception
    assert at.dataframe and "gpu" not in str(at.exception)


def timeline_links(at: AppTest) -> list[str]:
    """Label and query of each link to the Timeline: st.page_link inside st.navigation (an
    earlier test ran the app), a markdown link when the page runs on its own."""
    links = [m.value for m in at.markdown if "timeline?" in m.value]
    links += [f"{p.proto.label} {p.proto.query_string}" for p in at.get("page_link")]
    return [text.replace("%2C", ",") for text in links]


def test_distributed_page_names_the_straggler(ddp_store):
    at = page("distributed")
    assert not at.exception
    assert any("rank 1" in e.value for e in at.error)
    # the ranks' wait distribution, the wait heatmap and the critical path
    assert len(at.get("plotly_chart")) == 3
    links = timeline_links(at)
    assert any("Open straggler rank 1's timeline" in text and "ranks=0,1" in text for text in links)
    assert any(s.label == "Step" for s in at.selectbox)
    path = at.dataframe[-2].value if len(at.dataframe) > 2 else at.dataframe[-1].value
    assert {"rank", "what", "start_ms", "ms"} <= set(path.columns)
    assert (path["rank"] == 1).any()  # the straggler's sleep sets the step's end


def test_distributed_page_without_the_nccl_wait_tables(ddp_store, monkeypatch):
    """A report dict without rank_waits, critical_path and collective_ops (as before they
    existed): the findings still show, the page draws no straggler link or critical path
    (it reads those from the tables, not from the evidence) and does not fail."""
    from stallscope.pages import distributed

    def without(*args, **kwargs):
        report = report_for(*args, **kwargs)
        tables = {k: v for k, v in report["tables"].items() if k not in NCCL_TABLES}
        return {**report, "tables": tables}

    report_for = distributed.report_for
    monkeypatch.setattr(distributed, "report_for", without)
    at = page("distributed")
    assert not at.exception
    assert any("rank 1" in e.value for e in at.error)
    assert not any("Open straggler" in text for text in timeline_links(at))
    assert not any(s.label == "Step" for s in at.selectbox)


NCCL_TABLES = ("rank_waits", "critical_path", "collective_ops")


def test_distributed_page_finds_a_rank(ddp_store):
    at = page("distributed")
    at.text_input(key="dist_rank").set_value("1").run()
    assert not at.exception
    assert any("Rank 1 is the rank 1 other rank(s) waited for" in i.value for i in at.info)
    assert any("Open rank 1's timeline" in t and "ranks=1" in t for t in timeline_links(at))
    at.text_input(key="dist_rank").set_value("0").run()
    assert any("waiting for rank 1" in w.value for w in at.warning)  # rank 0's own finding
    at.text_input(key="dist_rank").set_value("7").run()
    assert any("No rank 7 in this job" in w.value for w in at.warning)


def test_occupancy_page(ddp_store):
    at = page("occupancy")
    assert not at.exception
    assert at.dataframe


def test_occupancy_page_shows_nsight_compute_measurements(store, monkeypatch):
    from tests.conftest import SAMPLES

    paths = [SAMPLES / "kineto" / "occupancy" / "occupancy.pt.trace.json.gz"]
    paths += sorted((SAMPLES / "ncu").glob("occupancy.*.csv"))
    ingest_paths(store, [str(p) for p in paths])
    monkeypatch.setenv("STALLSCOPE_STORE", str(store.root))
    at = page("occupancy")
    assert not at.exception
    frame = at.dataframe[0].value.set_index("kernel")
    assert frame.loc["low_occupancy_smem_kernel", "ncu bound"] == "latency"
    assert frame.loc["low_occupancy_smem_kernel", "ncu achieved %"] > 0
    assert any("Nsight Compute's measurements" in c.value for c in at.caption)


def test_thresholds_one_analyzer_at_a_time_and_kept(app_store):
    at = page("overview", job=job_id(app_store, "idle.pt.trace.json"))
    shown = {n.key for n in at.sidebar.number_input}
    assert shown and len({k.split("_")[1] for k in shown}) == 1  # one analyzer's inputs only
    first = sorted(shown)[0]
    at.sidebar.number_input(key=first).set_value(at.sidebar.number_input(key=first).value + 1).run()
    assert "1 changed" in at.sidebar.expander[0].label
    analyzers = at.sidebar.selectbox(key="thr_analyzer").options
    at.sidebar.selectbox(key="thr_analyzer").set_value(
        next(o for o in analyzers if o != at.sidebar.selectbox(key="thr_analyzer").value)
    ).run()
    assert not at.exception
    assert "1 changed" in at.sidebar.expander[0].label  # kept while another analyzer is shown


def test_library_delete_removes_my_upload_then_the_job(app_store, tmp_path):
    hand = job_id(app_store, "hand.pt.trace.json")
    again = tmp_path / "again"
    again.mkdir()
    ingest_paths(
        app_store,
        [str(hand_trace().write(again / "hand.pt.trace.json"))],
        uploaded_by="cy",
        tags=["cy"],
    )
    at = page("library")
    row = at.dataframe[0].value.set_index("job").loc[hand]
    assert row["uploaded by"] == "ana, cy" and row["tags"] == "cy, demo"
    at.selectbox(key="manage_job").set_value(hand).run()
    at.text_input(key=f"remover_{hand}").set_value("cy").run()
    at.checkbox(key=f"confirm_{hand}").check().run()
    _delete_button(at).click().run()
    assert not at.exception
    assert app_store.job(hand)["uploaders"] == ["ana"]
    assert any(f"Removed cy's upload of job {hand}" in s.value for s in at.success)
    at.selectbox(key="manage_job").set_value(hand).run()
    at.text_input(key=f"remover_{hand}").set_value("ana").run()
    at.checkbox(key=f"confirm_{hand}").check().run()
    _delete_button(at).click().run()
    assert any(f"Deleted job {hand}" in s.value for s in at.success)
    assert [j["name"] for j in app_store.jobs()] == ["idle.pt.trace.json"]


def test_library_delete_for_everyone(app_store):
    idle = job_id(app_store, "idle.pt.trace.json")
    at = page("library")
    at.selectbox(key="manage_job").set_value(idle).run()
    at.text_input(key=f"remover_{idle}").set_value("someone else").run()
    at.checkbox(key=f"everyone_{idle}").check().run()
    at.checkbox(key=f"confirm_{idle}").check().run()
    _delete_button(at).click().run()
    assert not at.exception
    assert [j["name"] for j in app_store.jobs()] == ["hand.pt.trace.json"]


def _delete_button(at):
    return next(b for b in at.button if b.label == "Delete")


def test_overview_findings_heading_names_both_counts(app_store):
    """ "Findings (2) · 13 info" read as 2 of 2; the heading says which are to act on."""
    from stallscope.pages.overview import _ms, findings_heading

    assert findings_heading(2, 13) == "Findings: 2 to act on · 13 info"
    assert findings_heading(0, 0) == "Findings: 0 to act on"
    # tile values short enough to stay whole in a third of a laptop-wide page
    assert [_ms(v) for v in (62.31, 623.1, 2104.0, 21_043.0, 0.08)] == [
        "62.3 ms", "623 ms", "2104 ms", "21.0 s", "80 µs"
    ]  # fmt: skip
    at = page("overview", job=job_id(app_store, "hand.pt.trace.json"))
    assert not at.exception
    (heading,) = [s.value for s in at.subheader if s.value.startswith("Findings")]
    assert " to act on" in heading
