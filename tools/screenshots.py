"""Screenshot every dashboard page in headless Chromium (for review and the README).

Usage: python tools/screenshots.py [--out screenshots] [--width 1440 --width 1024] [--access]

Starts ``stallscope serve`` on a fresh store with the sample traces, opens
each page with Playwright driving Debian's ``/usr/bin/chromium``, and writes
``<out>/<page>-<width>.png``. ``--access`` instead shows a team server with
``STALLSCOPE_TOKEN`` set: the login form, a wrong token, the library after
login, and an upload over the quota (``access-*.png``).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("STALLSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    store: Path, port: int, samples: bool = True, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """``stallscope serve`` on 127.0.0.1:``port``, once it answers and its samples (if any) are
    in; ``env`` adds variables."""
    args = [
        sys.executable,
        "-m",
        "stallscope.cli",
        "serve",
        "--store",
        str(store),
        "--port",
        str(port),
    ]
    if not samples:
        args.append("--no-samples")
    proc = subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                break
        except OSError:
            time.sleep(0.3)
    else:
        stop_server(proc)
        raise TimeoutError("the dashboard did not start")
    from stallscope import preload

    while preload.status(store) is not None:  # the samples load in the background
        if time.time() > deadline + 600:
            stop_server(proc)
            raise TimeoutError("the sample preload did not finish")
        time.sleep(0.5)
    return proc


def stop_server(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    proc.wait(timeout=30)


def wait_idle(page, timeout_ms: int = 60_000) -> None:
    """Wait until Streamlit has finished running the page script."""
    page.wait_for_selector(
        "[data-testid='stApp'][data-test-script-state='notRunning']", timeout=timeout_ms
    )
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stSkeleton\"]')", timeout=timeout_ms
    )
    page.wait_for_timeout(1000)  # let charts finish drawing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="screenshots")
    parser.add_argument("--width", type=int, action="append")
    parser.add_argument("--access", action="store_true", help="the login and quota screens")
    parser.add_argument(
        "--only", action="append", help="only these pages (e.g. memory); repeatable"
    )
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    widths = args.width or [1440, 1024]
    if args.access:
        return access_shots(out, widths[0])
    store = Path(tempfile.mkdtemp(prefix="stallscope-shots-")) / "store"
    port = free_port()
    server = start_server(store, port)
    try:
        from stallscope.store import Store

        jobs = {j["name"]: j["job_id"] for j in Store(store).jobs()}
        pages = shot_urls(store, jobs)
        if args.only:
            pages = {k: v for k, v in pages.items() if k in args.only}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            for width in widths:
                page = browser.new_page(viewport={"width": width, "height": 1000})
                for name, path in pages.items():
                    page.goto(f"http://127.0.0.1:{port}/{path}")
                    wait_idle(page)
                    page.screenshot(path=str(out / f"{name}-{width}.png"), full_page=True)
                    print(out / f"{name}-{width}.png")
                page.close()
            if not args.only:
                _upload_shots(browser, port, out, widths[0])
            browser.close()
    finally:
        stop_server(server)
    return 0


DEFAULT_JOB = "dataloader"  # the sample job a page is shot on when its shot names none


def shot_urls(store: Path, jobs: dict[str, str]) -> dict[str, str]:
    """Shot name -> URL path of every declared page's shots (``PageSpec.shots``; a page that
    declares none: one shot, named as the page, on :data:`DEFAULT_JOB`), in navigation order."""
    from stallscope.pages.spec import Shot, pages

    urls = {}
    for name, (spec, _) in pages().items():
        for shot in spec.shots or (Shot(name),):
            params = dict.fromkeys(spec.needs, DEFAULT_JOB) | dict(shot.params)
            ids = {k: _job_named(jobs, v) for k, v in params.items()}
            if shot.files:
                ids["job"] = _ingested(store, shot)
            query = "&".join(f"{k}={v}" for k, v in ids.items() if v)
            urls[shot.name] = spec.url_path + (f"?{query}" if query else "")
    return urls


def _job_named(jobs: dict[str, str], part: str) -> str | None:
    """The id of the sample job with the shortest name holding ``part`` (else the first job)."""
    named = sorted((k for k in jobs if part in k), key=len)
    return jobs[named[0]] if named else next(iter(jobs.values()), None)


def _ingested(store: Path, shot) -> str:
    """The id of the job of ``shot.files`` (sample files ingested together) in the served store."""
    from stallscope.ingest import ingest_paths
    from stallscope.store import Store

    samples = Path(__file__).resolve().parents[1] / "sample_traces"
    paths = [str(samples / p) for p in shot.files]
    (res,) = ingest_paths(Store(store), paths, name=shot.job)
    return res.job_id


def _upload_shots(browser, port: int, out: Path, width: int) -> None:
    """The library page after a good and after a bad upload (``upload-ok``, ``upload-error``)."""
    import gzip

    folder = Path(tempfile.mkdtemp(prefix="stallscope-shots-upload-"))
    sample = Path(__file__).resolve().parent.parent / "sample_traces" / "kineto" / "healthy"
    good = folder / "healthy_uncompressed.json"  # new bytes, so a new job rather than a re-find
    good.write_bytes(gzip.decompress(next(sample.glob("*.json.gz")).read_bytes()))
    bad = folder / "broken.json"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not a trace")
    for name, upload in (("upload-ok", good), ("upload-error", bad)):
        page = browser.new_page(viewport={"width": width, "height": 1000})
        page.goto(f"http://127.0.0.1:{port}/")
        wait_idle(page)
        page.get_by_text("Upload traces").click()  # an expander once the store has jobs
        page.locator("input[type=file]").set_input_files(str(upload))
        page.get_by_role("button", name="Ingest").click()
        page.wait_for_selector("[data-testid='stAlert']", timeout=120_000)
        wait_idle(page)
        page.screenshot(path=str(out / f"{name}-{width}.png"), full_page=False)
        print(out / f"{name}-{width}.png")
        page.close()


def access_shots(out: Path, width: int) -> int:
    """A token-guarded server: login form, wrong token, library after login, quota refusal."""
    from playwright.sync_api import sync_playwright

    token = "team-token"
    store = Path(tempfile.mkdtemp(prefix="stallscope-shots-")) / "store"
    port = free_port()
    env = {"STALLSCOPE_TOKEN": token, "STALLSCOPE_UPLOAD_QUOTA_MB": "1"}
    server = start_server(store, port, env=env)
    big = Path(tempfile.mkdtemp(prefix="stallscope-shots-upload-")) / "big.json"
    big.write_bytes(b" " * (2 * 1024 * 1024))
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": width, "height": 800})

            def shot(name: str) -> None:
                page.screenshot(path=str(out / f"access-{name}-{width}.png"), full_page=False)
                print(out / f"access-{name}-{width}.png")

            page.goto(f"http://127.0.0.1:{port}/overview")
            shot("login")
            page.get_by_label("Team token").fill("guess")
            page.get_by_role("button", name="Enter").click()
            page.get_by_text("Wrong token.").wait_for()
            shot("wrong-token")
            page.get_by_label("Team token").fill(token)
            page.get_by_role("button", name="Enter").click()
            wait_idle(page)
            page.goto(f"http://127.0.0.1:{port}/")
            wait_idle(page)
            shot("library")
            page.get_by_text("Upload traces").click()
            page.locator("input[type=file]").set_input_files(str(big))
            page.wait_for_timeout(3000)
            page.get_by_role("button", name="Ingest").click()
            page.get_by_text("Upload refused").wait_for()
            wait_idle(page)
            shot("quota")
            page.get_by_test_id("stMainMenu").click()  # the menu of a team server: no Deploy
            page.get_by_text("Print").wait_for()
            shot("menu")
            browser.close()
    finally:
        stop_server(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
