"""The SQL page (streamlit's AppTest): corrupt data, hostile text, what it shows.

The sandbox itself is tested in tests/test_sql.py, the page in Chromium in
tests/test_browser.py.
"""

from __future__ import annotations

from tests import test_pages

app_store = test_pages.app_store  # the same two-job store and fresh page caches
fresh_caches = test_pages.fresh_caches
page, job_id = test_pages.page, test_pages.job_id


def test_sql_page_survives_a_corrupt_parquet_file(app_store):
    bad = job_id(app_store, "idle.pt.trace.json")
    (ref,) = app_store.traces(bad)
    ref.table_path("gpu").write_bytes(b"PAR1 garbage PAR1")
    at = page("sql")
    assert not at.exception and "gpu" in set(at.dataframe[0].value["table"])
    at.text_area[0].set_value("SELECT count(*) AS n FROM catalog").run()
    at.button[0].click().run()
    assert not at.exception and not at.error
    assert int(at.dataframe[-1].value["n"][0]) == 1
    (warning,) = at.warning
    assert f"job {bad} left out: {ref.trace_id}/gpu.parquet cannot be read" in warning.value


def test_sql_page_shows_user_text_literally(app_store):
    """A message that echoes the user's text is escaped, never rendered as Markdown/HTML
    (tests/test_browser.py checks what Chromium shows)."""
    at = page("sql")
    at.text_area[0].set_value('SELECT * FROM "![x](http://127.0.0.1:9/x.png)<img src=x>"').run()
    at.button[0].click().run()
    (error,) = at.error
    assert error.value.startswith("` no table '![x](http://127.0.0.1:9/x.png)<img src=x>'")
    assert error.value.endswith(" `") and error.value.count("`") == 2
