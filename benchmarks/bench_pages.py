"""Time every dashboard page against the real server on a ~50 MB trace.

    python benchmarks/bench_pages.py [TRACE.json] [--runs 1]
    python benchmarks/bench_pages.py --store STORE [--job ID]


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

With ``--store`` the pages of a job already in that store are timed instead (the
newest job, or ``--job``; the store is only read): e.g. the 1,024-rank job that
``bench_crossrank.py --keep DIR`` leaves, analyzed once so that its report is stored
(issue 15's target: any page of a 1,024-rank job <= 2 s after its report exists).
Compare then compares the job with itself.
"""

from __future__ import annotations

import argparse
import contextlib
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


def visit(browser, url: str, timeout_s: float = 120) -> float:
    """Seconds until the page at ``url`` is drawn in a new tab (inf: not within ``timeout_s``;
    a screenshot of it is then left beside the benchmark's data)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    t = time.perf_counter()
    page.goto(url, wait_until="commit")
    try:
        page.wait_for_function(DONE, timeout=timeout_s * 1000, polling=20)
        elapsed = time.perf_counter() - t
    except PlaywrightTimeout:
        elapsed = float("inf")
        DATA.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DATA / "bench_pages_timeout.png"), full_page=True)
    print(f"  {url}: {elapsed:.2f} s", flush=True)
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
    parser.add_argument("--store", type=Path, help="time a job already in this store (read only)")
    parser.add_argument("--job", help="with --store: the job (default: the newest)")
    parser.add_argument(
        "--fresh", action="store_true",
        help="a new server per page: each first visit reads the report and builds everything",
    )  # fmt: skip
    args = parser.parse_args()
    if args.store:
        time_pages(args.store, args.job, f"store {args.store}", args.fresh)
        return
    if not args.trace.is_file():
        args.trace.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(SRC, "rb") as src, open(args.trace, "wb") as dst:
            shutil.copyfileobj(src, dst)
    store = Path(tempfile.mkdtemp(prefix="stallscope-bench-pages-")) / "store"
    subprocess.run([str(STALLSCOPE), "ingest", "--store", str(store), str(args.trace)],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    size = args.trace.stat().st_size / 1e6
    try:
        time_pages(store, None, f"trace {args.trace.name} ({size:.1f} MB)")
    finally:
        shutil.rmtree(store.parent, ignore_errors=True)


@contextlib.contextmanager
def _server(store: Path):
    """A ``stallscope serve`` of ``store`` (its port), the browser's first request made."""
    port = free_port()
    server = start_server(store, port, samples=False)
    try:
        yield port
    finally:
        stop_server(server)


def _in_app(browser, port: int, job: str, pages: dict[str, str]) -> dict[str, float]:
    """Each page reached by its sidebar link from the open app (the Overview first)."""
    app = browser.new_page(viewport={"width": 1440, "height": 1000})
    app.goto(f"http://127.0.0.1:{port}/overview?job={job}")
    app.wait_for_function(DONE, timeout=120_000, polling=20)
    in_app = {}
    for name, path in pages.items():
        if name in ("library", "overview"):
            continue
        title = name.capitalize() if name != "sql" else "SQL"
        in_app[name] = navigate(app, title, path.split("?")[0])
    in_app["overview"] = navigate(app, "Overview", "overview")
    app.close()
    return in_app


def time_pages(store: Path, job: str | None, what: str, fresh: bool = False) -> None:
    """Open every page of ``job`` (default: the store's newest) in a real server and print the
    table of times; ``fresh``: a new server for each page."""
    from playwright.sync_api import sync_playwright

    from stallscope.store import Store

    job = job or Store(store).jobs()[0]["job_id"]
    from stallscope.pages.spec import pages as declared

    pages = {  # every declared page, each URL parameter it needs naming ``job``
        name: spec.url_path
        + "".join(f"{'&' if i else '?'}{k}={job}" for i, k in enumerate(spec.needs))
        for name, (spec, _) in declared().items()
    }
    print(f"{what}, job {job}; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f", {os.cpu_count()} cores")  # fmt: skip
    results: dict[str, tuple[float, float]] = {}
    in_app: dict[str, float] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        browser.new_page().close()  # start the browser itself
        if fresh:  # a new server per page: its first visit finds nothing cached
            for name, path in pages.items():
                with _server(store) as port:
                    url = f"http://127.0.0.1:{port}/{path}"
                    results[name] = (visit(browser, url), visit(browser, url))
        else:
            with _server(store) as port:
                for name, path in pages.items():
                    url = f"http://127.0.0.1:{port}/{path}"
                    results[name] = (visit(browser, url), visit(browser, url))
                in_app = _in_app(browser, port, job, pages)
        browser.close()
    first = "first visit (a fresh server)" if fresh else "first visit"
    print(
        f"\n| page | new tab, {first} s | new tab, second visit s | in the open app s |"
        "\n|---|---:|---:|---:|"
    )
    for name, (cold, warm) in results.items():
        nav = in_app.get(name)
        print(f"| {name} | {cold:.2f} | {warm:.2f} | {'-' if nav is None else f'{nav:.2f}'} |")
    print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
