"""The team token in a real browser: log in once, the session survives reloads and new tabs,
another browser sees the login form, uploads work when logged in and are refused otherwise.

Debian's Chromium driven by Playwright against `stallscope serve` on 127.0.0.1 with
STALLSCOPE_TOKEN set. Skips only when no Chromium is installed.
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
TOKEN = "team-secret-42"
MAX_UPLOAD_MB = 2


@pytest.fixture
def server(tmp_path):
    store, port = tmp_path / "store", free_port()
    env = {
        "STALLSCOPE_TOKEN": TOKEN,
        "STALLSCOPE_MAX_UPLOAD_MB": str(MAX_UPLOAD_MB),
        "STALLSCOPE_UPLOAD_QUOTA_MB": "4",
    }
    proc = start_server(store, port, samples=False, env=env)
    yield f"http://127.0.0.1:{port}", store
    stop_server(proc)


def _login_form(page):
    return page.get_by_label("Team token")


def test_token_once_then_reloads_and_new_tabs_need_no_token(server, tmp_path):
    from playwright.sync_api import sync_playwright

    url, store = server
    trace = SAMPLES / "kineto" / "dataloader_stall" / "dataloader_stall.pt.trace.json.gz"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.goto(f"{url}/")
        _login_form(page).fill("wrong")
        page.get_by_role("button", name="Enter").click()
        page.get_by_text("Wrong token.").wait_for()
        _login_form(page).fill(TOKEN)
        page.get_by_role("button", name="Enter").click()
        wait_idle(page)
        page.get_by_text("Upload traces").first.wait_for()
        (cookie,) = [c for c in context.cookies() if c["name"] == "stallscope_session"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

        page.reload()
        wait_idle(page)
        assert _login_form(page).count() == 0
        page.get_by_text("Upload traces").first.wait_for()

        tab = context.new_page()  # a new tab of the same browser
        tab.goto(f"{url}/sql")
        wait_idle(tab)
        assert _login_form(tab).count() == 0 and tab.get_by_text("SQL").count() >= 1

        stranger = browser.new_context().new_page()  # another browser: no cookie
        stranger.goto(f"{url}/")
        _login_form(stranger).wait_for()
        assert stranger.get_by_text("Upload traces").count() == 0

        # a logged-in upload goes through the gate and is ingested; its PUT is recorded
        puts: list[str] = []
        page.on(
            "request",
            lambda r: puts.append(r.url) if r.method == "PUT" and "upload_file" in r.url else None,
        )
        page.locator("input[type=file]").set_input_files(str(trace))
        page.get_by_role("button", name="Ingest").click()
        page.get_by_text(re.compile("Ingested: dataloader_stall")).wait_for(timeout=120_000)
        assert len(Store(store).jobs()) == 1
        assert puts

        # the same upload URL (a live session, its file id) from the stranger's browser: 401
        refused = stranger.context.request.put(puts[0], multipart=_file(b"x" * 1000))
        assert refused.status == 401

        # logged in: over the per-file limit is still refused by Streamlit (413), and over the
        # 4 MB quota (the trace, then 1.5 MB twice) by the gate (429) with its reason
        xsrf = next(c["value"] for c in context.cookies() if c["name"] == "_streamlit_xsrf")
        headers = {"X-Xsrftoken": xsrf}
        big = context.request.put(
            puts[0], multipart=_file(b"x" * (MAX_UPLOAD_MB + 1) * 2**20), headers=headers
        )
        assert big.status == 413
        one_and_a_half = _file(b"x" * 3 * 2**19)
        for _ in range(2):
            ok = context.request.put(puts[0], multipart=one_and_a_half, headers=headers)
            assert ok.status == 204
        over = context.request.put(puts[0], multipart=one_and_a_half, headers=headers)
        assert over.status == 429 and "quota of 4 MB per 60 min" in over.text()
        page.reload()  # the Library page says why the last upload was refused
        wait_idle(page)
        page.get_by_text("Upload traces").click()
        page.get_by_text("Upload refused: quota of 4 MB per 60 min reached").wait_for()
        browser.close()


def _file(data: bytes) -> dict:
    return {"file": {"name": "t.json", "mimeType": "application/json", "buffer": data}}


def test_token_link_logs_in_once_and_leaves_the_url(server):
    from playwright.sync_api import sync_playwright

    url, _ = server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{url}/sql?token={TOKEN}")
        wait_idle(page)
        assert "token" not in page.url and page.url.endswith("/sql")
        assert _login_form(page).count() == 0
        page.goto(f"{url}/")  # the cookie, not the link, keeps the session
        wait_idle(page)
        assert _login_form(page).count() == 0
        # a team server shows no Deploy button, nor Deploy in its menu (toolbarMode viewer)
        assert page.get_by_text("Deploy").count() == 0
        page.get_by_test_id("stMainMenu").click()
        page.get_by_text("Print").wait_for()
        assert page.get_by_text("Deploy").count() == 0
        browser.close()


def test_link_from_another_site_reaches_the_page_once_logged_in(server):
    """SameSite=Strict: a link followed from another site (here localhost, a different site
    from 127.0.0.1) arrives without the cookie; the login page finds the session and reloads."""
    from playwright.sync_api import sync_playwright

    url, _ = server
    port = url.rsplit(":", 1)[1]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{url}/?token={TOKEN}")
        wait_idle(page)
        statuses: list[int] = []
        page.on("response", lambda r: statuses.append(r.status) if "/sql" in r.url else None)
        page.goto(f"http://localhost:{port}{'/stallscope/login'}")  # another site
        page.evaluate(
            "u => { const a = document.createElement('a'); a.href = u; a.id = 'out';"
            " a.textContent = 'SQL'; document.body.appendChild(a); }",
            f"{url}/sql",
        )
        page.click("#out")
        page.wait_for_url(f"{url}/sql")
        wait_idle(page)
        assert _login_form(page).count() == 0
        assert statuses[:2] == [401, 200]  # without the cookie, then reloaded with it
        browser.close()
