"""In a real browser: the Library shows each job's worst severity and step time from its stored
report, and "not analyzed yet" (numbers: a dash) for a job without one (Chromium against
`stallscope serve`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stallscope import report_store
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


def ingest(store: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "stallscope.cli", "ingest", "--store", str(store), *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def test_library_shows_worst_severity_and_step_time(tmp_path):
    from playwright.sync_api import sync_playwright

    store_dir = tmp_path / "store"
    ddp = SAMPLES / "kineto" / "ddp_straggler"
    ingest(store_dir, *sorted(str(p) for p in ddp.glob("*.json.gz")))  # analyzed at ingest
    healthy = next((SAMPLES / "kineto" / "healthy").glob("*.json.gz"))
    ingest(store_dir, "--no-analyze", str(healthy))
    store = Store(store_dir)
    by_name = {j["name"]: j for j in store.jobs()}
    analyzed, plain = (
        by_name["ddp_straggler"],
        next(j for n, j in by_name.items() if n != "ddp_straggler"),
    )
    summary = report_store.default_summary(store, analyzed["job_id"], analyzed["trace_ids"])
    worst = f"{summary['worst_severity']} ({summary['worst_count']})"
    step = summary["step_ms_median"]
    assert worst.startswith("critical") and 50 < step < 80  # the straggler's sleep: 50 ms a step
    port = free_port()
    proc = start_server(store_dir, port, samples=False)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/")
            wait_idle(page)
            grid = page.locator("[data-testid='stDataFrame']")
            grid.wait_for(timeout=60_000)
            rows = _grid_rows(page)
            browser.close()
    finally:
        stop_server(proc)
    header = rows[0]
    for column in ("worst", "step ms", "GPU busy %"):
        assert column in header, header
    cells = {row[header.index("job")]: row for row in rows[1:]}
    assert cells[analyzed["job_id"]][header.index("worst")] == worst
    # (the accessible table holds the values; the canvas draws them rounded)
    assert float(cells[analyzed["job_id"]][header.index("step ms")]) == pytest.approx(
        step, rel=0.005
    )  # 3 significant digits
    busy = float(cells[analyzed["job_id"]][header.index("GPU busy %")])
    assert busy == pytest.approx(summary["gpu_busy_pct"], abs=0.5)
    assert cells[plain["job_id"]][header.index("worst")] == "not analyzed yet"
    # a number the job's report does not give is an empty cell here (the canvas draws the
    # placeholder, a dash), never Streamlit's "None"
    numbers = [header.index(c) for c in ("step ms", "GPU busy %", "ms/token")]
    assert [cells[plain["job_id"]][i] for i in numbers] == [""] * 3
    assert cells[analyzed["job_id"]][header.index("ms/token")] == ""  # not an inference job
    # the Library analyzed nothing: the plain job still has no report
    assert report_store.default_summary(store, plain["job_id"], plain["trace_ids"]) is None


def _grid_rows(page) -> list[list[str]]:
    """The dataframe's header and rows as text, from the grid's accessible table (the cells are
    drawn on a canvas; Glide Data Grid mirrors them into a hidden ARIA table)."""
    return page.evaluate(
        """() => {
          const table = document.querySelector("[data-testid='stDataFrame'] table");
          return Array.from(table.querySelectorAll('tr')).map(
            tr => Array.from(tr.querySelectorAll('th, td')).map(c => c.innerText.trim()));
        }"""
    )
