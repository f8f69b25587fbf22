"""Dashboard pages render against a real store (streamlit's AppTest)."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from stallscope.ingest import ingest_paths
from tests.test_utilization import hand_trace


@pytest.fixture
def app_store(store, tmp_path, monkeypatch):
    ingest_paths(store, [str(hand_trace().write(tmp_path / "hand.pt.trace.json"))], tags=["demo"])
    monkeypatch.setenv("STALLSCOPE_STORE", str(store.root))
    return store


def test_library_lists_the_job(app_store, tmp_path):
    at = AppTest.from_function(_app, default_timeout=60).run()
    assert not at.exception
    assert any("hand.pt.trace.json" in m.value for m in at.markdown)


def test_overview_shows_findings(app_store):
    (job,) = app_store.jobs()
    at = AppTest.from_function(_overview, default_timeout=60)
    at.query_params["job"] = job["job_id"]
    at.run()
    assert not at.exception
    titles = [e.label for e in at.expander]
    assert any("GPU 0 busy 75.0%, idle 25.0%" in t for t in titles)


def _app():
    from stallscope.pages.main import main

    main()


def _overview():
    from stallscope.pages import overview

    overview.render()
