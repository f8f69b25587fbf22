"""In Chromium: what the overview shows a performance engineer, names given at upload and
changed in the Library, and the HTML report at 1440 px.

Debian's Chromium driven by Playwright against `stallscope serve` on 127.0.0.1
(skips only when no Chromium is installed; CI installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

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


@pytest.fixture
def server(tmp_path):
    store, port = tmp_path / "store", free_port()
    proc = start_server(store, port, samples=False)
    yield f"http://127.0.0.1:{port}", Store(store)
    stop_server(proc)


def _sample(store: Store, scenario: str) -> str:
    """Ingest one sample trace; its job id."""
    (result,) = ingest_paths(store, [str(next((KINETO / scenario).glob("*.json.gz")))])
    return result.job_id


def _metrics(page) -> dict[str, str]:
    labels = page.locator("[data-testid='stMetricLabel']").all_inner_texts()
    values = page.locator("[data-testid='stMetricValue']").all_inner_texts()
    return {label.strip(): value.strip() for label, value in zip(labels, values, strict=True)}


def _legends(page) -> list[str]:
    """The legend entries of every plotly chart on the page (SVG text: no innerText)."""
    return page.eval_on_selector_all(
        ".js-plotly-plot .legendtext", "els => els.map(e => e.textContent)"
    )


def test_overview_headline_step_bars_copies_and_evidence(server):
    from playwright.sync_api import sync_playwright

    url, store = server
    stall, copies = _sample(store, "dataloader_stall"), _sample(store, "pageable_sync")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        page.goto(f"{url}/overview?job={stall}")
        wait_idle(page)
        metrics = _metrics(page)
        for label in ("Step time", "Step p90", "Jitter", "GPU busy", "GPU idle"):
            assert label in metrics, metrics
        assert re.fullmatch(r"\d+(\.\d)? ms", metrics["Step time"]), metrics
        assert re.fullmatch(r"\d+\.\d\dx", metrics["Jitter"]), metrics
        # the per-step stacked bar, with the data-loader stall as its idle cause
        assert page.get_by_text("Where each step's time goes").count() == 1
        assert "idle: dataloader" in _legends(page)
        # findings: the worst open, its fix and what fixing it saves
        summaries = page.locator("[data-testid='stExpander'] summary").all_inner_texts()
        assert any("saves ~" in s and "ms if fixed" in s for s in summaries), summaries
        assert page.get_by_text("Fix.", exact=False).count() >= 1
        # the evidence, drawn when its toggle is switched on (in the open finding)
        opened = page.locator("[data-testid='stExpander']").filter(has_text="Fix.").first
        opened.get_by_text("Evidence", exact=True).click()
        wait_idle(page)
        cells = opened.locator("[data-testid^='glide-cell']")
        cells.first.wait_for(state="attached")
        texts = [t.strip() for t in cells.all_text_contents()]
        assert "dataloader" in texts, texts  # the cause, as a table row
        assert not [t for t in texts if re.fullmatch(r"\d{7,}", t)], texts  # no raw ns/bytes
        assert opened.get_by_text("As stored (exact units: ns, bytes)").count() == 1
        # no Deploy button or developer menu on a served dashboard
        assert page.get_by_role("button", name="Deploy").count() == 0

        page.goto(f"{url}/overview?job={copies}")
        wait_idle(page)
        assert re.search(r"copies alone \d+%", page.inner_text("body")), "copy share not shown"
        assert "copies alone (no kernel beside them)" in _legends(page)
        browser.close()


def test_overview_of_a_straggler_job_splits_busy_time_and_names_the_waiting(server):
    """ddp_straggler: rank 0's GPU sits in all-reduces waiting for rank 1. The per-GPU bars
    draw parts that never overlap (the waiting apart), and under the busy tile the busy share
    without that waiting, as the report's numbers give it (docs/metrics.md)."""
    from playwright.sync_api import sync_playwright

    from stallscope import report_store
    from stallscope.charts import busy_shares, device_time_table

    url, store = server
    traces = sorted(str(p) for p in (KINETO / "ddp_straggler").glob("*.json.gz"))
    (result,) = ingest_paths(store, traces)
    report, _ = report_store.ensure(store, store.traces(result.job_id))
    shares = busy_shares(device_time_table(report))
    assert shares["busy_no_wait_pct"] < shares["busy_pct"] - 30  # 190 of 500 ms: waiting
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        page.goto(f"{url}/overview?job={result.job_id}")
        wait_idle(page)
        body = page.inner_text("body")
        assert f"GPU busy without NCCL waiting: {shares['busy_no_wait_pct']:.0f}%" in body
        assert _metrics(page)["GPU busy"] == f"{shares['busy_pct']:.0f}%"
        legends = _legends(page)
        for part in ("compute only", "communication under compute",
                     "communication alone: waiting for other ranks"):  # fmt: skip
            assert part in legends, legends
        browser.close()


def test_name_at_upload_then_rename_and_notes_in_the_library(server, tmp_path):
    from playwright.sync_api import sync_playwright

    url, store = server
    trace = next((KINETO / "healthy").glob("*.json.gz"))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        page.goto(url)
        wait_idle(page)
        page.locator("input[type=file]").set_input_files(str(trace))
        page.get_by_label("Job name").fill("baseline run 12")
        page.get_by_role("button", name="Ingest").click()
        page.get_by_text(re.compile("Ingested: baseline run 12")).wait_for(timeout=180_000)
        (job,) = store.jobs()
        assert job["name"] == "baseline run 12"

        page.reload()
        wait_idle(page)
        page.get_by_text("Edit or delete a job").click()
        page.get_by_label("Name", exact=True).fill("baseline run 12, bf16")
        page.get_by_label("Notes").last.fill("bf16 autocast, batch 32")
        page.get_by_role("button", name="Save name, tags and notes").click()
        wait_idle(page)
        (job,) = store.jobs()
        assert job["name"] == "baseline run 12, bf16"
        assert job["notes"] == "bf16 autocast, batch 32"

        page.goto(f"{url}/overview?job={job['job_id']}")
        wait_idle(page)
        body = page.inner_text("body")
        assert "baseline run 12, bf16" in body and "Notes: bf16 autocast, batch 32" in body
        browser.close()


def test_html_report_fits_a_1440_px_page(tmp_path):
    from playwright.sync_api import sync_playwright

    out = tmp_path / "report.html"
    trace = next((KINETO / "dataloader_stall").glob("*.json.gz"))
    subprocess.run(
        [sys.executable, "-m", "stallscope.cli", "analyze", str(trace), "--format", "html",
         "--output", str(out), "--store", str(tmp_path / "store")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
        page.goto(out.as_uri())
        page.wait_for_load_state("load")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the report is {overflow} px wider than the page"
        assert page.get_by_text("Fix", exact=False).count() >= 1
        browser.close()


# Letters/digits runs whose text is drawn on more than one line: words broken mid-word. A long
# identifier may break at its _ . / : (the report's <wbr>): those are not inside a run.
_BROKEN_WORDS_JS = """() => {
  const broken = [];
  for (const cell of document.querySelectorAll('td, th')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.data.matchAll(/[A-Za-z0-9]+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top)));
        if (tops.size > 1) broken.push(m[0]);
      }
    }
  }
  return broken;
}"""

# The chart's title (a heading, or plotly's own title) and its legend, as [left, top, right,
# bottom] boxes on the page.
_TITLE_AND_LEGEND_JS = """() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const plot = document.querySelector('.js-plotly-plot');
  const heading = Array.from(document.querySelectorAll('h1, h2, h3'))
    .find(h => h.textContent.startsWith('GPU time by cause'));
  const title = heading || plot.querySelector('.gtitle');
  return [box(title), box(plot.querySelector('.legend'))];
}"""


@pytest.mark.parametrize("width", [1440, 1024])
def test_html_report_title_clear_of_legend_and_words_whole(tmp_path, width):
    """The 2-rank sample's report: the chart title is not drawn under its legend, and no table
    cell breaks a word across lines ("CRITICA / L", "rank0.pt.trace.js / on.gz" before)."""
    from playwright.sync_api import sync_playwright

    out = tmp_path / "report.html"
    traces = sorted(str(p) for p in (KINETO / "ddp_straggler").glob("*.json.gz"))
    subprocess.run(
        [sys.executable, "-m", "stallscope.cli", "analyze", *traces, "--format", "html",
         "--output", str(out), "--store", str(tmp_path / "store")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": width, "height": 900}).new_page()
        page.goto(out.as_uri())
        page.wait_for_selector(".js-plotly-plot .legend")
        title, legend = page.evaluate(_TITLE_AND_LEGEND_JS)
        apart = (
            title[2] <= legend[0]
            or legend[2] <= title[0]
            or title[3] <= legend[1]
            or legend[3] <= title[1]
        )
        assert apart, f"title {title} overlaps legend {legend}"
        assert page.evaluate(_BROKEN_WORDS_JS) == []
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the report is {overflow} px wider than the page"
        browser.close()
