"""Time every dashboard page against the real server on a ~50 MB trace.

    python benchmarks/bench_pages.py [TRACE.json] [--runs 1]

The trace defaults to ``benchmarks/data/df_index_resolver.json`` (the corpus
trace ``hta/df_index_resolver`` decompressed: 53.7 MB, 216k events), made if
missing. It is ingested into a fresh temporary store, then
``stallscope serve --store TMP --no-samples`` is started and each page is opened
in Debian's Chromium through Playwright (the helpers of tools/screenshots.py).
A page's time runs from ``page.goto`` until Streamlit's script state is
``notRunning`` with the page's elements drawn and no skeleton left. Each page
is visited twice: first (cold: nothing in the server's ``st.cache_*`` for this
trace, apart from what earlier pages cached) and again (warm), each in a new
browser tab. The issue's target is every page under 1 s after ingest.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.screenshots import CHROMIUM, CHROMIUM_ARGS, free_port, start_server, stop_server  # noqa: E402

DATA = REPO / "benchmarks" / "data"
SRC = REPO.parent / "shared" / "corpus" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"
STALLSCOPE = Path(sys.executable).with_name("stallscope")

DONE = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  return app && app.getAttribute('data-test-script-state') === 'notRunning'
    && document.querySelector('[data-testid="stMain"] [data-testid="stElementContainer"]')
    && !document.querySelector('[data-testid="stSkeleton"]');
}"""


def visit(browser, url: str) -> float:
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    t = time.perf_counter()
    page.goto(url, wait_until="commit")
    page.wait_for_function(DONE, timeout=120_000, polling=20)
    elapsed = time.perf_counter() - t
    page.close()
    return elapsed


def navigate(page, title: str, path: str) -> float:
    """Click a sidebar link in an app that is already open: what a user feels between pages."""
    t = time.perf_counter()
    page.locator('[data-testid="stSidebarNav"] a', has_text=title).first.click()
    if path:
        page.wait_for_url(f"**/{path}*", timeout=60_000)
    page.wait_for_timeout(30)  # let the rerun start
    page.wait_for_function(DONE, timeout=120_000, polling=20)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?", type=Path, default=DATA / "df_index_resolver.json")
    args = parser.parse_args()
    if not args.trace.is_file():
        args.trace.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(SRC, "rb") as src, open(args.trace, "wb") as dst:
            shutil.copyfileobj(src, dst)
    from playwright.sync_api import sync_playwright

    store = Path(tempfile.mkdtemp(prefix="stallscope-bench-pages-")) / "store"
    subprocess.run([str(STALLSCOPE), "ingest", "--store", str(store), str(args.trace)],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    from stallscope.store import Store

    job = Store(store).jobs()[0]["job_id"]
    pages = {
        "library": "",
        "overview": f"overview?job={job}",
        "timeline": f"timeline?job={job}",
        "kernels": f"kernels?job={job}",
        "distributed": f"distributed?job={job}",
        "occupancy": f"occupancy?job={job}",
        "compare": f"compare?base={job}&new={job}",
        "sql": "sql",
    }
    size = args.trace.stat().st_size / 1e6
    print(f"trace {args.trace.name} ({size:.1f} MB), job {job}; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f", {os.cpu_count()} cores")  # fmt: skip
    port = free_port()
    server = start_server(store, port, samples=False)
    results = {}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            warm = browser.new_page()
            warm.goto(f"http://127.0.0.1:{port}/_stcore/health")  # start the browser itself
            warm.close()
            for name, path in pages.items():
                url = f"http://127.0.0.1:{port}/{path}"
                results[name] = (visit(browser, url), visit(browser, url))
            app = browser.new_page(viewport={"width": 1440, "height": 1000})
            app.goto(f"http://127.0.0.1:{port}/overview?job={job}")
            app.wait_for_function(DONE, timeout=120_000, polling=20)
            in_app = {}
            for name, path in pages.items():
                if name in ("library", "overview"):
                    continue
                in_app[name] = navigate(
                    app, name.capitalize() if name != "sql" else "SQL", path.split("?")[0]
                )
            in_app["overview"] = navigate(app, "Overview", "overview")
            browser.close()
    finally:
        stop_server(server)
        shutil.rmtree(store.parent, ignore_errors=True)
    print(
        "\n| page | new tab, first visit s | new tab, second visit s | in the open app s |\n|---|---:|---:|---:|"
    )
    for name, (cold, warm) in results.items():
        nav = in_app.get(name)
        print(f"| {name} | {cold:.2f} | {warm:.2f} | {'-' if nav is None else f'{nav:.2f}'} |")
    print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
