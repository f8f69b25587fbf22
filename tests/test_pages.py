"""Every dashboard page renders against a real store (streamlit's AppTest)."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from stallscope.ingest import ingest_paths
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
    assert any("GPU 0 busy 75.0%, idle 25.0%" in t for t in titles)


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


def test_compare_two_jobs(app_store):
    at = page("compare")
    assert not at.exception
    assert len(at.dataframe) == 3  # step time, time by cause, kernels
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
    at.text_area[0].set_value("SELECT count(*) AS n FROM gpu").run()
    at.button[0].click().run()
    assert not at.exception and int(at.dataframe[-1].value["n"][0]) > 0
    at.text_area[0].set_value("SELECT * FROM read_csv('/etc/passwd')").run()
    at.button[0].click().run()
    assert at.error and "passwd" in at.error[0].value


def _app():
    from stallscope.pages.main import main

    main()


def test_shared_token_guards_the_dashboard(app_store, monkeypatch):
    monkeypatch.setenv("STALLSCOPE_TOKEN", "s3cret")
    at = AppTest.from_function(_app, default_timeout=60).run()
    assert not at.exception and at.text_input[0].label == "Team token"
    assert not at.dataframe  # nothing of the store is shown
    at.text_input[0].set_value("wrong")
    at.button[0].click().run()
    assert at.error[0].value == "Wrong token."
    at.text_input[0].set_value("s3cret")
    at.button[0].click().run()
    assert not at.error and at.dataframe  # the library's job table


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


def test_distributed_page_names_the_straggler(ddp_store):
    at = page("distributed")
    assert not at.exception
    assert any("rank 1" in e.value for e in at.error)
    assert len(at.get("plotly_chart")) == 1


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
