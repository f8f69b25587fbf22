"""In Chromium: the timeline shows every rank of a job, search moves the window, and the
Overview's link to a finding's window opens in the same tab.

Debian's Chromium driven by Playwright against `stallscope serve` on 127.0.0.1
(skips only when no Chromium is installed; CI installs it).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from stallscope.ingest import ingest_paths
from stallscope.store import Store
from tests.conftest import REPO, SAMPLES

sys.path.insert(0, str(REPO / "tools"))
from screenshots import CHROMIUM, CHROMIUM_ARGS, free_port, start_server, stop_server, wait_idle  # noqa: E402

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and not shutil.which("chromium"), reason="no Chromium"
)


@pytest.fixture
def ddp(tmp_path):
    """A server on a store holding the 2-rank ddp_straggler sample; (url, job id)."""
    store_dir, port = tmp_path / "store", free_port()
    store = Store(store_dir).ensure()
    folder = SAMPLES / "kineto" / "ddp_straggler"
    (res,) = ingest_paths(store, [str(p) for p in sorted(folder.glob("rank*.pt.trace.json.gz"))])
    proc = start_server(store_dir, port, samples=False)
    yield f"http://127.0.0.1:{port}", res.job_id
    stop_server(proc)


def _param(page, name: str) -> str | None:
    return parse_qs(urlparse(page.url).query).get(name, [None])[0]


POINT = """() => {
  const gd = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
  const t = gd._fullData.find(t => t.name === 'compute events');
  const k = Math.floor(t.x.length / 2), xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const r = gd.getBoundingClientRect();
  return [r.left + xa._offset + xa.l2p(t.x[k]), r.top + ya._offset + ya.l2p(t.y[k])];
}"""  # the screen position of a compute kernel's middle point


def _lanes(page) -> list[str]:
    return page.locator("[data-testid='stPlotlyChart'] .ytick text").all_text_contents()


def test_both_ranks_search_and_same_tab_finding_link(ddp):
    from playwright.sync_api import sync_playwright

    url, job = ddp
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        page = context.new_page()
        page.goto(f"{url}/timeline?job={job}")
        wait_idle(page)
        lanes = _lanes(page)
        assert any(t.startswith("rank 0 · GPU 0") for t in lanes), lanes
        assert any(t.startswith("rank 1 · GPU 1") for t in lanes), lanes
        before = _param(page, "window")

        x, y = page.evaluate(POINT)  # a click on a kernel selects it: details and its launch
        page.mouse.click(x, y)
        page.wait_for_function("() => location.search.includes('event=')", timeout=60_000)
        wait_idle(page)
        assert "|gpu|" in _param(page, "event")
        page.get_by_text("Selected: ").first.wait_for(timeout=60_000)  # the details panel
        assert page.get_by_text("Selected: ").count() == 1

        page.get_by_label("Search slices by name").fill("ncclDevKernel")
        page.get_by_label("Search slices by name").press("Enter")
        wait_idle(page)
        page.locator("[data-testid='stSelectbox']", has_text="Matches").click()
        page.get_by_role("option").nth(2).click()
        wait_idle(page)
        after = _param(page, "window")
        assert after != before
        start, end = (int(x) for x in after.split("-"))
        assert end - start < (lambda a, b: b - a)(*(int(x) for x in before.split("-"))) / 4
        assert _param(page, "event") and "|gpu|" in _param(page, "event")
        page.get_by_text("Selected: ncclDevKernel").wait_for(timeout=60_000)

        page.goto(f"{url}/overview?job={job}")
        wait_idle(page)
        link = page.get_by_role("link", name="Show the worst window on the timeline").first
        t = time.perf_counter()
        link.click()
        page.wait_for_url("**/timeline?**", timeout=60_000)
        wait_idle(page)
        elapsed = time.perf_counter() - t
        assert len(context.pages) == 1  # the same tab, no new one
        assert _param(page, "finding") and _param(page, "job") == job
        assert _lanes(page), "the timeline drew no lanes"
        print(f"overview -> timeline in the same tab: {elapsed:.2f} s (incl. 1 s settle)")
        browser.close()
