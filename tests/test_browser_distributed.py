"""In Chromium: the Distributed page of a 256-rank job stays readable (a binned heatmap, one
histogram of the ranks' waits, one entry for the waiting ranks), finds one rank, and opens the
straggler's own timeline in one click.

Debian's Chromium driven by Playwright against `stallscope serve` on 127.0.0.1
(skips only when no Chromium is installed). ``STALLSCOPE_SHOTS=DIR`` keeps the screenshot.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from stallscope.ingest import ingest_paths
from stallscope.store import Store
from tests.conftest import REPO
from tests.ddp_builder import MS, Plan, ddp_job

sys.path.insert(0, str(REPO / "tools"))
from screenshots import CHROMIUM, CHROMIUM_ARGS, free_port, start_server, stop_server, wait_idle  # noqa: E402

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and not shutil.which("chromium"), reason="no Chromium"
    ),
]

HEATMAP_ROWS = """() => {
  const charts = document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot');
  const gd = [...charts].find(g => g.data[0].type === 'heatmap');
  return gd.data[0].y;
}"""  # the wait heatmap's row labels, as drawn (the axis shows only some of them)
RANKS, STRAGGLER = 256, 137  # rank 137 loads data 20 ms longer each step; the others wait


@pytest.fixture
def big_job(tmp_path):
    """A server on a store holding a simulated 256-rank DDP job; (url, job id, store)."""
    plans = [Plan(stall_ns=20 * MS if r == STRAGGLER else 0) for r in range(RANKS)]
    traces, _ = ddp_job(plans, steps=2)
    folder = tmp_path / "job"
    folder.mkdir()
    paths = [str(t.write(folder / f"rank{r}.pt.trace.json")) for r, t in enumerate(traces)]
    store_dir, port = tmp_path / "store", free_port()
    store = Store(store_dir).ensure()
    (res,) = ingest_paths(store, paths)
    proc = start_server(store_dir, port, samples=False)
    yield f"http://127.0.0.1:{port}", res.job_id, store
    stop_server(proc)


def test_distributed_page_of_256_ranks(big_job, tmp_path):
    from playwright.sync_api import sync_playwright

    url, job_id, store = big_job
    shots = Path(os.environ.get("STALLSCOPE_SHOTS") or tmp_path)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1440, "height": 2200}).new_page()
        page.goto(f"{url}/distributed?job={job_id}")
        wait_idle(page, 300_000)
        page.get_by_text(f"How long the {RANKS} ranks waited").wait_for(timeout=60_000)
        page.screenshot(path=str(shots / "distributed_256_ranks.png"), full_page=True)
        # one entry for the 255 waiting ranks, not 255 boxes
        alerts = page.locator("[data-testid='stAlert']")
        assert alerts.count() == 1
        assert f"waiting for rank {STRAGGLER}" in alerts.first.inner_text()
        page.get_by_text(f"Same finding on {RANKS - 1} ranks").wait_for()
        page.get_by_text(f"{RANKS} ranks in bins of 4").wait_for()
        rows = page.evaluate(HEATMAP_ROWS)
        assert len(rows) == RANKS // 4 and rows[0] == "ranks 0-3" and rows[-1] == "ranks 252-255"
        # jump to one rank
        box = page.get_by_label("Find a rank")
        box.fill(str(STRAGGLER))
        box.press("Enter")
        wait_idle(page)
        page.get_by_text(
            f"Rank {STRAGGLER} is the rank {RANKS - 1} other rank(s) waited for"
        ).wait_for()
        page.get_by_text("In the heatmap: the row of ranks 136-139.").wait_for()
        # the straggler's own timeline, one click away, in the same tab
        page.get_by_role("link", name=f"Open straggler rank {STRAGGLER}'s timeline").click()
        wait_idle(page, 300_000)
        query = parse_qs(urlparse(page.url).query)
        assert urlparse(page.url).path.endswith("/timeline")
        ranks = {r.meta["rank"]: r.trace_id for r in store.traces(job_id)}
        assert query["trace"] == [ranks[STRAGGLER]]
        assert str(STRAGGLER) in query["ranks"][0].split(",")
        start, end = (int(x) for x in query["window"][0].split("-"))
        assert end > start
        browser.close()
