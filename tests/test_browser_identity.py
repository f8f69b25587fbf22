"""In Chromium: the job stays the job on every page; same-named uploads are never merged.

Debian's Chromium driven by Playwright against `stallscope serve` on 127.0.0.1
(skips only when no Chromium is installed; CI installs it).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from stallscope.ingest import ingest_paths
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
KINETO = SAMPLES / "kineto"
PAGES = ["Timeline", "Kernels", "Distributed", "Occupancy", "Library", "SQL", "Overview"]


@pytest.fixture
def server(tmp_path):
    store, port = tmp_path / "store", free_port()
    proc = start_server(store, port, samples=False)
    yield f"http://127.0.0.1:{port}", Store(store)
    stop_server(proc)


def _browser(p):
    return p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def _job_in_url(page) -> str | None:
    return parse_qs(urlparse(page.url).query).get("job", [None])[0]


def test_deep_linked_job_stays_on_every_page(server):
    from playwright.sync_api import sync_playwright

    url, store = server
    for scenario in ("dataloader_stall", "healthy", "occupancy"):
        ingest_paths(store, [str(next((KINETO / scenario).glob("*.json.gz")))])
    jobs = store.jobs()
    target = jobs[-1]  # not the newest: a page that forgets the job falls back to jobs[0]
    trace = store.traces(target["job_id"])[0].trace_id
    with sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.goto(f"{url}/overview?trace={trace}")
        wait_idle(page)
        assert _job_in_url(page) == target["job_id"]
        for name in PAGES:
            page.locator("[data-testid='stSidebarNav'] a", has_text=name).first.click()
            wait_idle(page)
            if name in ("Library", "SQL"):
                continue  # pages without a job of their own; the job must survive them
            assert _job_in_url(page) == target["job_id"], f"{name} switched job: {page.url}"
            picker = page.locator("[data-testid='stSidebar'] input[aria-label='Job']")
            assert target["job_id"] in picker.input_value(), name
        page.go_back()
        wait_idle(page)
        assert _job_in_url(page) in (None, target["job_id"])
        page.reload()
        wait_idle(page)
        assert _job_in_url(page) == target["job_id"]
        browser.close()


def _same_named(paths: list[Path]) -> list[dict]:
    return [
        {"name": "trace.json.gz", "mimeType": "application/gzip", "buffer": path.read_bytes()}
        for path in paths
    ]


def test_same_named_uploads_are_stored_apart(server):
    from playwright.sync_api import sync_playwright

    url, store = server
    unrelated = [
        next((KINETO / s).glob("*.json.gz")) for s in ("healthy", "occupancy", "cuda_graph")
    ]
    ranks = sorted((KINETO / "ddp_overlap").glob("rank*.pt.trace.json.gz"))
    with sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.goto(url)
        wait_idle(page)
        page.locator("input[type=file]").set_input_files(_same_named(unrelated))
        page.get_by_text("Unrelated files (one job each)").click()
        page.get_by_role("button", name="Ingest").click()
        page.get_by_text(re.compile("Ingested: trace.json.gz")).nth(2).wait_for(timeout=180_000)
        assert page.get_by_text("Already stored; your upload was recorded").count() == 0
        assert len(store.jobs()) == 3
        page.reload()
        wait_idle(page)
        page.get_by_text("Upload traces").click()
        page.locator("input[type=file]").set_input_files(_same_named(ranks))
        page.get_by_label("Job name").fill("ddp run 7")
        page.get_by_role("button", name="Ingest").click()
        page.get_by_text(re.compile("Ingested: ddp run 7 .* 2 rank")).wait_for(timeout=180_000)
        browser.close()
    (job,) = [j for j in store.jobs() if j["name"] == "ddp run 7"]
    assert len(job["trace_ids"]) == 2
    assert {r.meta["file_name"] for r in store.traces()} == {"trace.json.gz"}
