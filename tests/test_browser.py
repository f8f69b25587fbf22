"""End to end in a real browser: upload a trace, see its findings, open its deep link elsewhere.

Debian's Chromium driven by Playwright against `stallscope serve` on 127.0.0.1.
Skips only when no Chromium is installed (CI installs it: see .ci/run).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from stallscope.store import Store
from tests.conftest import REPO, SAMPLES

sys.path.insert(0, str(REPO / "tools"))
from screenshots import CHROMIUM, CHROMIUM_ARGS, free_port, start_server, stop_server, wait_idle  # noqa: E402

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and not shutil.which("chromium"), reason="no Chromium"
    ),
]


@pytest.fixture
def server(tmp_path):
    store, port = tmp_path / "store", free_port()
    proc = start_server(store, port, samples=False)
    yield f"http://127.0.0.1:{port}", store
    stop_server(proc)


def test_upload_then_findings_then_deep_link(server, tmp_path):
    from playwright.sync_api import sync_playwright

    url, store = server
    trace = SAMPLES / "kineto" / "dataloader_stall" / "dataloader_stall.pt.trace.json.gz"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.goto(url)
        wait_idle(page)
        page.locator("input[type=file]").set_input_files(str(trace))
        page.get_by_label("Tags (comma separated)").fill("e2e")
        page.get_by_role("button", name="Ingest").click()
        page.get_by_text(re.compile("Ingested: dataloader_stall")).wait_for(timeout=120_000)
        (job,) = Store(store).jobs()
        assert job["tags"] == ["e2e"]
        page.get_by_role("link", name="Open its overview").click()
        wait_idle(page)
        page.get_by_text("waiting for input data").first.wait_for(timeout=60_000)
        # a teammate opens the deep link in another browser context (no shared session)
        other = browser.new_context().new_page()
        other.goto(f"{url}/overview?job={job['job_id']}")
        wait_idle(other)
        other.get_by_text("waiting for input data").first.wait_for(timeout=60_000)
        assert other.get_by_text("CRITICAL").count() >= 1
        browser.close()


def test_bad_upload_shows_one_line_and_keeps_the_store(server, tmp_path):
    from playwright.sync_api import sync_playwright

    url, store = server
    bad = tmp_path / "broken.json"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not a trace")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(url)
        wait_idle(page)
        page.locator("input[type=file]").set_input_files(str(bad))
        page.get_by_role("button", name="Ingest").click()
        page.get_by_text("PNG image, not a trace").wait_for(timeout=60_000)
        browser.close()
    assert Store(store).jobs() == []


def test_sql_page_refuses_explain_analyze_copy_and_shows_text_literally(server, tmp_path):
    """The reported escape, typed into the page: refused in one line, the store byte-identical."""
    from playwright.sync_api import sync_playwright

    from stallscope.ingest import ingest_paths
    from tests.kineto_builder import KinetoTrace
    from tests.test_sql import snapshot

    url, store_dir = server
    store = Store(store_dir).ensure()
    trace = KinetoTrace()
    trace.kernel("gemm", 0, 5_000)
    (result,) = ingest_paths(store, [str(trace.write(tmp_path / "t.json"))])
    target = store.jobs_dir.resolve() / result.job_id / "job.json"
    before = snapshot(store)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{url}/sql")
        wait_idle(page)

        def run(query: str):
            page.get_by_label("Query").fill(query)
            page.get_by_label("Query").press("Control+Enter")
            wait_idle(page)
            page.get_by_role("button", name="Run").click()
            wait_idle(page)
            return page.locator("[data-testid='stAlert']")

        alert = run(f"EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{target}' (FORMAT csv)")
        assert "only SELECT queries are allowed (got EXPLAIN)" in alert.inner_text()
        assert snapshot(store) == before and store.has_job(result.job_id)

        alert = run('SELECT * FROM "![x](http://127.0.0.1:9/x.png)<img src=x>"')
        assert "'![x](http://127.0.0.1:9/x.png)<img src=x>'" in alert.inner_text()
        assert alert.locator("img, a").count() == 0  # shown as text, not rendered

        run("SELECT count(*) AS kernels FROM gpu")
        page.get_by_text("1 rows").wait_for(timeout=30_000)
        browser.close()
    assert snapshot(store) == before


def test_zip_upload_skips_the_files_that_are_not_traces(server, tmp_path):
    import json
    import zipfile

    from playwright.sync_api import sync_playwright

    url, store = server
    path = tmp_path / "run7.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for rank in sorted((SAMPLES / "kineto" / "ddp_overlap").glob("rank*.pt.trace.json.gz")):
            zf.write(rank, f"run7/{rank.name}")
        zf.writestr("run7/meta.json", json.dumps({"run": 7}))
        zf.writestr("run7/notes.yaml", "lr: 0.1\n")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(url)
        wait_idle(page)
        page.locator("input[type=file]").set_input_files(str(path))
        page.get_by_role("button", name="Ingest").click()
        page.get_by_text(re.compile("Ingested: run7")).wait_for(timeout=120_000)
        page.get_by_text("run7.zip:run7/meta.json: skipped (JSON without any trace keys").wait_for()
        page.get_by_text("run7.zip:run7/notes.yaml: skipped (a .yaml file, not a trace)").wait_for()
        browser.close()
    (job,) = Store(store).jobs()
    assert len(job["trace_ids"]) == 2
