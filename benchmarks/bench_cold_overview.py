"""Cold Overview of an N-rank job in the real dashboard, and the ingest and analyze around it.

    python benchmarks/bench_cold_overview.py [--ranks 32] [--python PY] [--keep DIR]

The job is the N-rank job of ``bench_ranks.py`` (grown from the real 2-rank
sample ``sample_traces/kineto/ddp_straggler``). With ``--python`` (another
checkout's venv Python, e.g. ``/work/main/.venv/bin/python``) every
stallscope process runs that checkout's code: measure before and after a
change with the same script. Nothing of stallscope is imported here; every
step is a process started in a temporary folder (so this checkout never
shadows the other's package):

1. ``stallscope ingest`` of the job (wall seconds);
2. ``stallscope analyze JOB --format json``, twice (wall seconds each: the
   second reuses a stored report where the code stores one);
3. ``stallscope serve --no-samples`` on the store, then Chromium opens
   ``/overview?job=JOB`` in a new tab: seconds from ``goto`` until the script
   state is ``notRunning`` with the page drawn (no skeleton), first visit
   (cold server caches) and a second one in a new tab.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_ranks  # noqa: E402  (the N-rank job builder; imports no stallscope)

CHROMIUM = os.environ.get("STALLSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
DONE = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  return app && app.getAttribute('data-test-script-state') === 'notRunning'
    && document.querySelector('[data-testid="stMain"] [data-testid="stElementContainer"]')
    && !document.querySelector('[data-testid="stSkeleton"]')
    && !document.querySelector('[data-testid="stSpinner"]');
}"""


def timed(argv: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(python: str, store: Path, port: int, cwd: Path) -> subprocess.Popen:
    argv = [python, "-m", "stallscope.cli", "serve", "--store", str(store)]
    argv += ["--port", str(port), "--no-samples"]
    proc = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGTERM)
    raise TimeoutError("the dashboard did not start")


def visit(browser, url: str) -> float:
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    start = time.perf_counter()
    page.goto(url, wait_until="commit")
    page.wait_for_timeout(200)  # the first script run starts
    page.wait_for_function(DONE, timeout=300_000, polling=50)
    elapsed = time.perf_counter() - start
    if not page.get_by_text("Step time").count():
        raise RuntimeError("the overview has no step-time headline")
    page.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=32)
    parser.add_argument("--python", default=sys.executable, help="the Python of the checkout")
    parser.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    work = args.keep or Path(tempfile.mkdtemp(prefix="stallscope-bench-cold-"))
    work.mkdir(parents=True, exist_ok=True)
    store = work / "store"
    paths = bench_ranks.build_job(bench_ranks.load_sample(), args.ranks, work / "job")
    cli = [args.python, "-m", "stallscope.cli"]
    ingest_s, out = timed([*cli, "ingest", "--store", str(store), *map(str, paths)], work)
    job = out.split("job ", 1)[1].split()[0]
    analyze = [*cli, "analyze", job, "--store", str(store), "--format", "json", "-j", "1"]
    analyze_s = [timed(analyze, work)[0] for _ in range(2)]
    print(f"{args.ranks} ranks, job {job}; load average {os.getloadavg()[0]:.1f}")
    print(f"ingest {ingest_s:.1f} s; analyze {analyze_s[0]:.1f} s, again {analyze_s[1]:.1f} s")
    # the dashboard on a store where only 'ingest' ran: what a user opening the job feels
    shutil.rmtree(store)
    timed([*cli, "ingest", "--store", str(store), *map(str, paths)], work)
    port = free_port()
    server = serve(args.python, store, port, work)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            warm = browser.new_page()
            warm.goto(f"http://127.0.0.1:{port}/_stcore/health")
            warm.close()
            url = f"http://127.0.0.1:{port}/overview?job={job}"
            cold, again = visit(browser, url), visit(browser, url)
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"overview: new tab, first visit {cold:.1f} s; second visit {again:.1f} s")
    print(f"load average after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
