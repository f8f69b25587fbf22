"""The access gate of `stallscope serve` over real HTTP, and the Streamlit internals it needs.

The pins fail loudly when a Streamlit upgrade moves what the gate relies on (how
`streamlit run` finds the st.App, where the user middleware sits, the upload and
WebSocket routes, the in-memory upload store) instead of silently opening a hole.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from stallscope.access import COOKIE_NAME, SessionSigner
from stallscope.pages import gate
from tests.conftest import REPO
from tests.test_serve import free_port, wait_for

TOKEN = "gate-test-token"
MiB = 2**20

PIN_SCRIPT = """
import json, sys
import streamlit as st
from streamlit.web.server.app_discovery import discover_asgi_app
from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
from streamlit.runtime.runtime import Runtime
from streamlit.web.server.server import UPLOAD_FILE_ENDPOINT
from pathlib import Path
from stallscope.pages.gate import ENTRY, install

found = {p: discover_asgi_app(Path(p)) for p in sys.argv[1:]}
app = st.App(ENTRY, middleware=install())
starlette_app = app._build_starlette_app()
manager = MemoryUploadedFileManager(UPLOAD_FILE_ENDPOINT)
print(json.dumps({
    "discovered": {p: [r.is_asgi_app, r.import_string] for p, r in found.items()},
    "middleware": [m.cls.__module__ + "." + m.cls.__name__ for m in starlette_app.user_middleware],
    "routes": [
        [type(r).__name__, getattr(r, "path", ""), sorted(getattr(r, "methods", None) or [])]
        for r in starlette_app.routes
    ],
    "upload_url": manager.get_upload_urls("SESSION", ["f"])[0].upload_url,
    "file_storage": type(manager.file_storage).__name__,
    "runtime_has_upload_mgr": isinstance(Runtime.__dict__.get("uploaded_file_mgr"), property),
}))
"""


@pytest.fixture(scope="module")
def streamlit_internals(tmp_path_factory):
    store = tmp_path_factory.mktemp("pin") / "store"
    serve_app, app_py = REPO / "pages" / "serve_app.py", REPO / "app.py"
    out = subprocess.run(
        [sys.executable, "-c", PIN_SCRIPT, str(serve_app), str(app_py)],
        capture_output=True, text=True, timeout=120, check=True,
        env=dict(os.environ, STALLSCOPE_STORE=str(store), STALLSCOPE_TOKEN=TOKEN),
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1]), serve_app, app_py


def test_streamlit_run_serves_our_st_app(streamlit_internals):
    pins, serve_app, app_py = streamlit_internals
    assert pins["discovered"][str(serve_app)] == [True, "serve_app:app"]
    assert pins["discovered"][str(app_py)] == [True, "app:app"]


def test_the_gate_is_the_outermost_middleware(streamlit_internals):
    pins, *_ = streamlit_internals
    assert pins["middleware"][0] == "stallscope.pages.gate.AccessGate"


def test_streamlit_routes_are_where_the_gate_expects_them(streamlit_internals):
    pins, *_ = streamlit_internals
    routes = {(kind, path) for kind, path, _ in pins["routes"]}
    assert ("Route", "/_stcore/upload_file/{session_id}/{file_id}") in routes
    assert ("WebSocketRoute", "/_stcore/stream") in routes
    assert ("Route", "/_stcore/health") in routes
    puts = [path for _, path, methods in pins["routes"] if "PUT" in methods]
    assert "/_stcore/upload_file/{session_id}/{file_id}" in puts
    # every upload URL Streamlit hands out is one the gate charges to a quota
    match = gate.UPLOAD_PATH.match(pins["upload_url"])
    assert match and match.group(1) == "SESSION"
    # the files-held count reads Streamlit's in-memory upload store
    assert pins["file_storage"] == "defaultdict" and pins["runtime_has_upload_mgr"]


def test_every_streamlit_endpoint_is_behind_the_gate(streamlit_internals):
    """Open without a cookie: only the health check. Anything else Streamlit serves is
    refused; its own endpoints as such (401), page-like paths with the login page."""
    pins, *_ = streamlit_internals
    open_paths = set()
    for _kind, path, _methods in pins["routes"]:
        if path in gate.HEALTH_PATHS:
            open_paths.add(path)
        elif path and not path.startswith(gate.STREAMLIT_PREFIXES):
            # page-like: Streamlit's own st.login routes, all refused with the login page
            assert path in {"/auth/login", "/auth/logout", "/oauth2callback"}, path
    assert open_paths == {"/_stcore/health"}


# --- a real server ----------------------------------------------------------------------


def _serve(store: Path, **env: str):
    """``stallscope serve`` with STALLSCOPE_TOKEN and ``env`` on a free port: (port, pid, proc)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stallscope.cli", "serve", "--store", str(store), "--port", str(port), "--no-samples"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env=dict(os.environ, STALLSCOPE_TOKEN=TOKEN, **env),
    )  # fmt: skip
    assert wait_for(f"http://127.0.0.1:{port}/_stcore/health") == "ok"
    return port, proc


def _stop(proc: subprocess.Popen) -> None:
    import signal

    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server with a 1 MB quota and at most 2 files held per user."""
    store = tmp_path_factory.mktemp("gate") / "store"
    port, proc = _serve(store, STALLSCOPE_UPLOAD_QUOTA_MB="1", STALLSCOPE_UPLOAD_MAX_FILES="2")
    try:
        yield port, proc.pid, store
    finally:
        _stop(proc)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):  # noqa: ANN002
        return None


def _get(port: int, path: str, cookie: str | None = None) -> tuple[int, dict, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if cookie:
        request.add_header("Cookie", f"{COOKIE_NAME}={cookie}")

    try:
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def _login(port: int) -> str:
    status, headers, _ = _get(port, f"/?token={TOKEN}")
    assert status == 303
    return headers["set-cookie"].split(";")[0].split("=", 1)[1]


def _raw(port: int, head: str, body_size: int = 0) -> str:
    """Send a request head and (unless the server answers first and closes) ``body_size``
    bytes; return the status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode())
        s.settimeout(2)
        try:
            first = s.recv(4096)
        except TimeoutError:
            first = b""
        chunk, sent = b"\0" * MiB, 0
        try:
            while sent < body_size and not first:
                s.sendall(chunk[: min(MiB, body_size - sent)])
                sent += MiB
        except OSError:
            pass
        if not first:
            s.settimeout(10)
            first = s.recv(4096)
        return first.decode("latin-1").split("\r\n", 1)[0]


def _put_head(port: int, size: int, cookie: str | None = None, session: str = "s1") -> str:
    lines = [
        f"PUT /_stcore/upload_file/{session}/f1 HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: multipart/form-data; boundary=b",
        f"Content-Length: {size}",
    ]
    if cookie:
        lines.append(f"Cookie: {COOKIE_NAME}={cookie}")
    return "\r\n".join(lines) + "\r\n\r\n"


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_without_the_cookie_pages_show_the_login_form_and_endpoints_refuse(server):
    port, *_ = server
    for path in ("/", "/overview?job=x", "/sql"):
        status, _, body = _get(port, path)
        assert status == 401 and 'name="token"' in body and "Team token" in body
    for path in ("/_stcore/host-config", "/_stcore/metrics", "/static/js/index.js", "/media/x"):
        assert _get(port, path)[0] == 401, path
    assert _get(port, "/_stcore/health")[:1] == (200,)
    assert _get(port, gate.SESSION_PATH)[0] == 401


def test_websocket_needs_the_cookie(server):
    port, *_ = server
    handshake = (
        f"GET /_stcore/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: streamlit\r\n"
    )
    assert _raw(port, handshake + "\r\n").split()[1] == "403"
    cookie = _login(port)
    assert _raw(port, handshake + f"Cookie: {COOKIE_NAME}={cookie}\r\n\r\n").split()[1] == "101"


def test_token_link_sets_the_cookie_once_and_drops_the_token(server):
    port, *_ = server
    status, headers, _ = _get(port, f"/overview?job=j1&token={TOKEN}")
    assert status == 303 and headers["location"] == "/overview?job=j1"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Max-Age=604800" in cookie
    value = cookie.split(";")[0].split("=", 1)[1]
    assert _get(port, "/", cookie=value)[0] == 200  # Streamlit's page
    assert _get(port, gate.SESSION_PATH, cookie=value)[0] == 204
    status, _, body = _get(port, "/?token=wrong")
    assert status == 401 and "Wrong token." in body


def test_login_form_post_sets_the_cookie_and_goes_back(server):
    port, *_ = server

    def post(data: bytes) -> tuple[int, dict, str]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{gate.LOGIN_PATH}", data=data, method="POST"
        )
        try:
            with urllib.request.build_opener(_NoRedirect).open(request, timeout=10) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    status, headers, _ = post(f"token={TOKEN}&next=/sql".encode())
    assert status == 303 and headers["location"] == "/sql"
    value = headers["set-cookie"].split(";")[0].split("=", 1)[1]
    assert _get(port, "/sql", cookie=value)[0] == 200
    status, headers, _ = post(f"token={TOKEN}&next=//evil.example/".encode())
    assert status == 303 and headers["location"] == "/"  # never to another site
    status, _, body = post(b"token=nope&next=/")
    assert status == 401 and "Wrong token." in body
    assert post(b"token=" + b"x" * 10_000)[0] == 413


def test_tampered_or_foreign_cookie_is_refused(server):
    port, _, store = server
    cookie = _login(port)
    head, mac = cookie.rsplit(".", 1)
    assert _get(port, "/", cookie=f"{head}.{'0' * len(mac)}")[0] == 401
    forged = SessionSigner(b"f" * 32).issue(3600)  # a key that is not the server's
    assert _get(port, "/", cookie=forged)[0] == 401
    assert (store / "access.key").exists()


@contextlib.contextmanager
def _live_session(port: int, cookie: str):
    """A logged-in Streamlit session, open as a browser tab opens one; yields its id."""
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    from websockets.sync.client import connect

    with connect(
        f"ws://127.0.0.1:{port}/_stcore/stream",
        subprotocols=["streamlit"],
        additional_headers={"Cookie": f"{COOKIE_NAME}={cookie}"},
    ) as ws:
        rerun = BackMsg()
        rerun.rerun_script.query_string = ""
        ws.send(rerun.SerializeToString())
        session = None
        for _ in range(1000):  # until the page script has run (its imports are done)
            message = ForwardMsg()
            message.ParseFromString(ws.recv(timeout=60))
            kind = message.WhichOneof("type")
            if kind == "new_session":
                session = message.new_session.initialize.session_id
            elif kind == "script_finished" and session:
                yield session
                return
        raise AssertionError("the page script did not finish")


def _xsrf(port: int) -> str:
    _, headers, _ = _get(port, "/_stcore/health")
    return headers["set-cookie"].split(";")[0].split("=", 1)[1]


def _multipart_put(port: int, session: str, file_id: str, size: int, cookies: str, xsrf: str):
    part = (
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="t.json"\r\n'
        b"Content-Type: application/json\r\n\r\n"
    )
    body_size = len(part) + size + len(b"\r\n--b--\r\n")
    head = _put_head(port, body_size, session=session).replace("/f1 ", f"/{file_id} ")
    head = head.replace("\r\n\r\n", f"\r\nX-Xsrftoken: {xsrf}\r\nCookie: {cookies}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode())
        try:
            s.sendall(part)
            for sent in range(0, size, MiB):
                s.sendall(b"x" * min(MiB, size - sent))
            s.sendall(b"\r\n--b--\r\n")
        except OSError:
            pass  # the server answered and closed without reading the body
        return s.recv(4096).decode("latin-1").split("\r\n", 1)[0].split()[1]


def test_uploads_to_a_live_session_without_the_cookie_are_refused_and_memory_stays_flat(
    tmp_path,
):
    """The reported hole: a visitor without the token uploading into a live session. Refused
    (401) before the body is read, 20 x 8 MiB leave the server's RSS flat; the same uploads
    with the cookie are stored, and the RSS shows them (the measurement can see growth)."""
    port, proc = _serve(tmp_path / "store")
    try:
        cookie = _login(port)
        with _live_session(port, cookie) as session:
            _uploads_with_and_without_the_cookie(port, proc.pid, session, cookie)
    finally:
        _stop(proc)


def _uploads_with_and_without_the_cookie(port: int, pid: int, session: str, cookie: str):
    xsrf = _xsrf(port)
    stranger = f"_streamlit_xsrf={xsrf}"  # Streamlit's XSRF cookie, not ours
    for i in range(3):  # warm up
        assert _multipart_put(port, session, f"w{i}", MiB, stranger, xsrf) == "401"
    before = _rss_bytes(pid)
    for i in range(20):  # 160 MiB offered
        assert _multipart_put(port, session, f"a{i}", 8 * MiB, stranger, xsrf) == "401"
    grown = _rss_bytes(pid) - before
    assert grown < 16 * MiB, f"server RSS grew {grown / MiB:.1f} MiB"

    member = f"{stranger}; {COOKIE_NAME}={cookie}"
    before = _rss_bytes(pid)
    for i in range(6):  # 48 MiB held in Streamlit's memory for this session
        assert _multipart_put(port, session, f"m{i}", 8 * MiB, member, xsrf) == "204"
    assert _rss_bytes(pid) - before > 32 * MiB


def test_unauthenticated_uploads_are_refused_unread(server):
    port, pid, _ = server
    for _ in range(3):
        assert _raw(port, _put_head(port, 8 * MiB), 8 * MiB).split()[1] == "401"


def test_quota_refuses_with_its_reason(server):
    port, *_ = server
    cookie = _login(port)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(_put_head(port, 2 * MiB, cookie=cookie).encode())
        s.sendall(b"x" * 2 * MiB)  # read and dropped, so that a browser sees the answer
        reply = b""
        while chunk := s.recv(4096):  # until the server closes
            reply += chunk
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 429")
    assert "Upload refused: this file (2 MB) is larger than the upload quota of 1 MB per" in reply
    # within the quota the gate passes it on and Streamlit refuses it (no XSRF token: 403);
    # a failed upload is not charged, so three of 0.7 MB all reach Streamlit
    for _ in range(3):
        assert _raw(port, _put_head(port, 700_000, cookie=cookie), 700_000).split()[1] == "403"
    no_length = _put_head(port, 0, cookie=cookie).replace("Content-Length: 0\r\n", "")
    assert _raw(port, no_length).split()[1] == "411"


def test_bad_quota_setting_is_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "stallscope.cli", "serve", "--store", str(tmp_path), "--no-samples"],
        capture_output=True, text=True, timeout=60,
        env=dict(os.environ, STALLSCOPE_UPLOAD_QUOTA_MB="-5"),
    )  # fmt: skip
    assert out.returncode == 3
    assert out.stderr.strip().splitlines() == [
        "stallscope: error: STALLSCOPE_UPLOAD_QUOTA_MB='-5' must be greater than 0"
    ]


def test_time_is_not_wasted_on_refused_requests(server):
    """A refused upload answers at once (the body is never awaited)."""
    port, *_ = server
    start = time.time()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(_put_head(port, 500 * MiB).encode())
        assert s.recv(4096).decode().startswith("HTTP/1.1 401")
    assert time.time() - start < 2
