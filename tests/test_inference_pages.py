"""The Inference page, the overview's inference headline and compare's decode table."""

from __future__ import annotations

import pytest

from stallscope.compare import compare_jobs, render_compare
from stallscope.ingest import ingest_paths
from tests.test_inference import item_python_loop, prefill_loop
from tests.test_pages import page
from tests.test_utilization import hand_trace


@pytest.fixture(autouse=True)
def fresh_caches():
    import streamlit as st

    st.cache_data.clear()
    yield


@pytest.fixture
def jobs(store, tmp_path, monkeypatch):
    ids = {}
    for name, trace in (
        ("prefill", prefill_loop()),
        ("item", item_python_loop()),
        ("train", hand_trace()),
    ):
        (res,) = ingest_paths(store, [str(trace.write(tmp_path / f"{name}.pt.trace.json"))])
        ids[name] = res.job_id
    monkeypatch.setenv("STALLSCOPE_STORE", str(store.root))
    return ids


def test_inference_page_draws_iterations_tpot_and_causes(jobs):
    at = page("inference", job=jobs["prefill"])
    assert not at.exception
    values = {m.label: m.value for m in at.metric}
    assert values["TPOT p50"] == "1.20 ms" and values["Prefill iterations"] == "1"
    assert values["Decode iterations"] == "10" and values["Tokens/s"] == "—"
    assert len(at.get("plotly_chart")) == 3  # timeline by phase, TPOT histogram, causes
    assert any("Prefills stall decode" in e.label for e in at.expander)


def test_inference_page_iteration_range_input(jobs):
    at = page("inference", job=jobs["prefill"])
    at.text_input(key="inference_iteration_range").input("^decode_step$").run()
    assert not at.exception and not at.error
    values = {m.label: m.value for m in at.metric}
    assert values["Prefill iterations"] == "0" and values["Decode iterations"] == "10"
    at.text_input(key="inference_iteration_range").input("decode_step(").run()
    assert not at.exception
    assert "is not a regular expression" in at.error[0].value
    assert {m.label: m.value for m in at.metric}["Prefill iterations"] == "1"  # ignored


def test_inference_page_on_a_training_job_says_why_not(jobs):
    at = page("inference", job=jobs["train"])
    assert not at.exception
    assert any("No inference iterations" in i.value for i in at.info)


def test_overview_headline_switches_to_time_per_token(jobs):
    at = page("overview", job=jobs["item"])
    assert not at.exception
    values = {m.label: m.value for m in at.metric}
    assert values["Time per token"] == "4.0 ms" and "Step time" not in values
    at = page("overview", job=jobs["train"])
    assert [m.label for m in at.metric][0].startswith("Step time")


def test_compare_reports_decode_time_and_tokens_per_s(store, jobs):
    overrides = {"inference": {"decode_batch": 16}}
    result = compare_jobs(
        store, store.traces(jobs["prefill"]), store.traces(jobs["item"]), overrides=overrides
    )
    rows = {row["metric"]: row for row in result["inference"]}
    median = rows["decode_iter_ms_median"]
    assert (median["base"], median["new"], median["delta"]) == (1.2, 4.0, 2.8)
    assert rows["tokens_per_s"]["new"] == 4000.0
    assert "Inference: decode" in render_compare(result, "text")
    plain = compare_jobs(store, store.traces(jobs["train"]), store.traces(jobs["train"]))
    assert plain["inference"] is None
    assert "Inference: decode" not in render_compare(plain, "text")
