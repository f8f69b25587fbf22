"""The dashboard's HTTP gate: team-token login, session cookie, upload quotas.

``stallscope serve`` runs ``serve_app.py``, an ``st.App`` (Streamlit's ASGI
application, served by uvicorn) with :class:`AccessGate` as its outermost
middleware. Every HTTP request and WebSocket passes through it before any
Streamlit route:

* With ``$STALLSCOPE_TOKEN`` set, a request without a valid session cookie
  gets the login page (page paths, 401) or a bare 401 (Streamlit's own
  endpoints: uploads, media, static files, component files), and its
  WebSocket is closed before a Streamlit session exists (HTTP 403). The body
  of such a request is never read. Only ``/_stcore/health`` and the login
  routes below stay open.
* ``POST /stallscope/login`` (the login form) or any page link with
  ``?token=`` checks the token and sets the cookie (HttpOnly,
  SameSite=Strict), then redirects to the page without the token in its URL.
  ``/stallscope/logout`` clears it; ``/stallscope/session`` answers 204 with
  a valid cookie, else 401.
* Every upload (``PUT /_stcore/upload_file/<session>/<file>``) is charged to
  its user (the cookie's login id; the Streamlit session without a token)
  and refused with 429 and one line when over the quota (bytes per window,
  files held), 411 without a Content-Length. The body of a refused upload is
  read and dropped (so the browser sees the 429, not a broken connection)
  when it is within Streamlit's ``server.maxUploadSize``, which Streamlit
  still enforces behind the gate.

Cookie format, key and quota rules: ``stallscope.access``.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from stallscope.access import (
    COOKIE_NAME,
    Session,
    SessionSigner,
    Settings,
    UploadQuota,
    server_key,
    token_matches,
)

ENTRY = str(Path(__file__).resolve().parent / "entry.py")
LOGIN_PATH = "/stallscope/login"
LOGOUT_PATH = "/stallscope/logout"
SESSION_PATH = "/stallscope/session"
# Streamlit 1.67's routes (streamlit/web/server/starlette/starlette_routes.py); pinned by
# tests/test_gate.py so an upgrade that moves them fails a test instead of opening a hole.
UPLOAD_PATH = re.compile(r"^/_stcore/upload_file/([^/]+)/([^/]+)$")
HEALTH_PATHS = frozenset({"/_stcore/health"})
STREAMLIT_PREFIXES = ("/_stcore/", "/static/", "/media/", "/component/", "/app/static/")
MAX_LOGIN_BODY = 8192
FAILED_LOGINS_PER_CLIENT = 20  # within FAILED_LOGIN_WINDOW_S, then 429 until they age out
FAILED_LOGIN_WINDOW_S = 600
FAILED_LOGIN_DELAY_S = 1.0
REFUSAL_SHOWN_S = 600  # the Library page repeats an upload refusal for this long

_KEEPER: Gatekeeper | None = None


class Gatekeeper:
    """The gate's state, shared by the middleware and the page scripts of one server."""

    def __init__(self, settings: Settings, key: bytes) -> None:
        self.settings = settings
        self.signer = SessionSigner(key)
        self.quota = UploadQuota(settings.quota_bytes, settings.quota_window_s, settings.max_files)
        self._failures: dict[str, deque[float]] = defaultdict(deque)
        self._sessions_of: dict[str, set[str]] = defaultdict(set)
        self._refused: dict[str, tuple[float, str]] = {}  # user -> (when, why), latest refusal

    @property
    def guarded(self) -> bool:
        """Whether a token is required (else the dashboard is open, quotas still apply)."""
        return bool(self.settings.token)

    def session(self, cookie: str | None) -> Session | None:
        """The session of a cookie value, None when not valid now."""
        return self.signer.verify(cookie)

    def upload_user(self, session: Session | None, streamlit_session_id: str) -> str:
        """Whose quota an upload counts against: the login, else the Streamlit session."""
        return f"login:{session.login_id}" if session else f"session:{streamlit_session_id}"

    def files_held(self, user: str, streamlit_session_id: str, replacing: str = "") -> int:
        """Uploaded files Streamlit holds in memory for ``user``'s sessions (all tabs of one
        login), not counting ``replacing`` (a file id being uploaded again)."""
        storage = _upload_storage()
        sessions = self._sessions_of[user]
        sessions.add(streamlit_session_id)
        held = 0
        for sid in list(sessions):
            files = storage.get(sid)
            if files is None:
                if sid != streamlit_session_id:
                    sessions.discard(sid)  # the session ended and Streamlit dropped its files
                continue
            held += sum(1 for file_id in list(files) if file_id != replacing)
        return held

    def note_refusal(self, user: str, reason: str, now: float) -> None:
        """Remember why ``user``'s upload was refused (the Library page shows it)."""
        old = [u for u, (when, _) in self._refused.items() if when < now - REFUSAL_SHOWN_S]
        for stale in old:
            del self._refused[stale]
        self._refused[user] = (now, reason)

    def last_refusal(self, user: str, now: float) -> str | None:
        """Why ``user``'s latest upload was refused, if that was in the last few minutes."""
        when, reason = self._refused.get(user, (0.0, ""))
        return reason if when >= now - REFUSAL_SHOWN_S else None

    def login_refused(self, client: str, now: float) -> bool:
        """Whether ``client`` failed too many logins recently."""
        failures = self._failures[client]
        while failures and failures[0] <= now - FAILED_LOGIN_WINDOW_S:
            failures.popleft()
        if not failures:
            del self._failures[client]
            return False
        return len(failures) >= FAILED_LOGINS_PER_CLIENT

    def login_failed(self, client: str, now: float) -> None:
        self._failures[client].append(now)


def _upload_storage() -> dict[str, dict[str, Any]]:
    """Streamlit's in-memory uploads, ``{session_id: {file_id: record}}`` (empty before the
    runtime starts). Relies on MemoryUploadedFileManager.file_storage (pinned by a test)."""
    from streamlit import runtime

    if not runtime.exists():
        return {}
    return runtime.get_instance().uploaded_file_mgr.file_storage


def install(store_root: Path | None = None, settings: Settings | None = None) -> list:
    """Make this process's gatekeeper and return the middleware list for ``st.App``."""
    from starlette.middleware import Middleware

    global _KEEPER
    settings = Settings.from_env() if settings is None else settings
    if store_root is None:
        from stallscope.store import default_store_path

        store_root = default_store_path()
    _KEEPER = Gatekeeper(settings, server_key(settings.token, store_root))
    return [Middleware(AccessGate, keeper=_KEEPER)]


def current() -> Gatekeeper | None:
    """The gatekeeper of this server process, None when the app runs without the gate
    (``streamlit run pages/entry.py``, AppTest)."""
    return _KEEPER


class AccessGate:
    """Pure ASGI middleware (see the module docstring): an unauthenticated body is never read."""

    def __init__(self, app, keeper: Gatekeeper) -> None:
        self.app, self.keeper = app, keeper

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in {"http", "websocket"}:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        session = self.keeper.session(_cookie(scope, COOKIE_NAME))
        if scope["type"] == "http" and path in {LOGIN_PATH, LOGOUT_PATH, SESSION_PATH}:
            await self._login_routes(scope, receive, send, session)
            return
        if self.keeper.guarded and path not in HEALTH_PATHS:
            if scope["type"] == "http" and _is_page(scope) and "token" in _query(scope):
                await self._token_link(scope, send, session)
                return
            if session is None:
                await self._refuse(scope, send)
                return
        upload = UPLOAD_PATH.match(path)
        if scope["type"] == "http" and scope["method"] == "PUT" and upload:
            await self._upload(scope, receive, send, session, *upload.groups())
            return
        await self.app(scope, receive, send)

    async def _refuse(self, scope, send) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        elif _is_page(scope):
            await _send(send, 401, _login_page(_path_with_query(scope)), "text/html")
        else:
            await _send(send, 401, b"Log in first: the team token is required.\n", close=True)

    async def _token_link(self, scope, send, session: Session | None) -> None:
        """A ``?token=`` link: log in (or fail) once, then the same page without the token."""
        query = _query(scope)
        clean = scope["path"] + (
            "?" + urlencode([(k, v) for k, v in query.items() if k != "token"])
            if len(query) > 1
            else ""
        )
        if session is not None:
            await _send(send, 303, b"", headers=[(b"location", clean.encode())])
            return
        client, now = _client(scope), time.time()
        if self.keeper.login_refused(client, now):
            page = _login_page(clean, "Too many wrong tokens: wait a few minutes.")
            await _send(send, 429, page, "text/html")
            return
        if not token_matches(query["token"], self.keeper.settings.token):
            self.keeper.login_failed(client, now)
            await asyncio.sleep(FAILED_LOGIN_DELAY_S)
            await _send(send, 401, _login_page(clean, "Wrong token."), "text/html")
            return
        await self._logged_in(scope, send, clean)

    async def _logged_in(self, scope, send, target: str) -> None:
        cookie = self.keeper.signer.issue(self.keeper.settings.session_s)
        headers = [
            (b"location", target.encode()),
            (b"set-cookie", self._cookie_header(scope, cookie, self.keeper.settings.session_s)),
        ]
        await _send(send, 303, b"", headers=headers)

    def _cookie_header(self, scope, value: str, max_age: int) -> bytes:
        secure = self.keeper.settings.cookie_secure or scope.get("scheme") in {"https", "wss"}
        attributes = f"; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict"
        return f"{COOKIE_NAME}={value}{attributes}{'; Secure' if secure else ''}".encode()

    async def _login_routes(self, scope, receive, send, session: Session | None) -> None:
        path, method = scope["path"], scope["method"]
        target = _safe_next(_query(scope).get("next", "/"))
        if path == SESSION_PATH:
            await _send(send, 204 if session or not self.keeper.guarded else 401, b"")
        elif path == LOGOUT_PATH:
            clear = self._cookie_header(scope, "", 0)
            await _send(send, 303, b"", headers=[(b"location", b"/"), (b"set-cookie", clear)])
        elif method in {"GET", "HEAD"}:
            if session is not None or not self.keeper.guarded:
                await _send(send, 303, b"", headers=[(b"location", target.encode())])
            else:
                await _send(send, 200, _login_page(target), "text/html")
        elif method == "POST":
            await self._login_post(scope, receive, send)
        else:
            await _send(send, 405, b"Method not allowed.\n", close=True)

    async def _login_post(self, scope, receive, send) -> None:
        body = await _read_small_body(scope, receive, MAX_LOGIN_BODY)
        if body is None:
            await _send(send, 413, b"Login form too large.\n", close=True)
            return
        form = dict(parse_qsl(body.decode("utf-8", "replace")))
        target = _safe_next(form.get("next", "/"))
        client, now = _client(scope), time.time()
        if self.keeper.login_refused(client, now):
            page = _login_page(target, "Too many wrong tokens: wait a few minutes.")
            await _send(send, 429, page, "text/html")
            return
        if not self.keeper.guarded or token_matches(form.get("token"), self.keeper.settings.token):
            await self._logged_in(scope, send, target)
            return
        self.keeper.login_failed(client, now)
        await asyncio.sleep(FAILED_LOGIN_DELAY_S)
        await _send(send, 401, _login_page(target, "Wrong token."), "text/html")

    async def _upload(
        self, scope, receive, send, session: Session | None, sid: str, file_id: str
    ) -> None:
        length = _header(scope, b"content-length")
        if not length or not length.isdigit():
            await _send(send, 411, b"Upload refused: Content-Length required.\n", close=True)
            return
        size, keeper = int(length), self.keeper
        user = keeper.upload_user(session, sid)
        reason = keeper.quota.admit(user, size, keeper.files_held(user, sid, replacing=file_id))
        if reason is not None:
            keeper.note_refusal(user, reason, time.time())
            # A browser that is still sending when the connection closes reports a bare
            # "Network Error"; a member's body (at most the upload limit) is read and dropped
            # so the browser gets the 429. Nothing of it is kept.
            if size <= _max_upload_bytes():
                await _drain(receive)
            await _send(send, 429, (reason + "\n").encode(), close=True)
            return
        status: list[int] = []

        async def watch(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if not status or status[0] >= 400:
                keeper.quota.refund(user, size)  # refused by Streamlit (413, XSRF...) or broken


def _is_page(scope) -> bool:
    """A GET/HEAD for an app page (not one of Streamlit's own endpoints)."""
    return (
        scope["type"] == "http"
        and scope["method"] in {"GET", "HEAD"}
        and not scope["path"].startswith(STREAMLIT_PREFIXES)
    )


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1").strip()
    return None


def _cookie(scope, name: str) -> str | None:
    for key, value in scope.get("headers", []):
        if key != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            k, _, v = part.strip().partition("=")
            if k == name:
                return v.strip('"')
    return None


def _query(scope) -> dict[str, str]:
    return dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))


def _path_with_query(scope) -> str:
    query = scope.get("query_string", b"").decode("latin-1")
    return scope["path"] + (f"?{query}" if query else "")


def _client(scope) -> str:
    client = scope.get("client")
    return client[0] if client else "?"


def _safe_next(target: str) -> str:
    """A same-site path to go back to after login (anything else becomes ``/``)."""
    ok = target.startswith("/") and not target.startswith("//") and "\\" not in target
    return target if ok and not any(c in target for c in "\r\n") else "/"


def _max_upload_bytes() -> int:
    """Streamlit's ``server.maxUploadSize`` in bytes, plus 1 MiB of multipart framing."""
    from streamlit import config

    return (int(config.get_option("server.maxUploadSize")) + 1) * 1024 * 1024


async def _drain(receive) -> None:
    """Read a request body to its end, keeping none of it."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body"):
            return


async def _read_small_body(scope, receive, limit: int) -> bytes | None:
    """The request body, or None when it is (or claims to be) over ``limit`` bytes."""
    length = _header(scope, b"content-length")
    if length and (not length.isdigit() or int(length) > limit):
        return None
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body"):
            return body


async def _send(
    send,
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    headers: list[tuple[bytes, bytes]] | None = None,
    close: bool = False,
) -> None:
    """A complete response; ``close`` drops the connection after it (an unread body)."""
    all_headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *(headers or []),
    ]
    if close:
        all_headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})


def _js_string(text: str) -> str:
    """``text`` as a JavaScript string literal that is safe inside an HTML <script>."""
    return json.dumps(text).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _login_page(target: str, error: str = "") -> bytes:
    """The login form: a plain HTML form that POSTs the token (works without JavaScript).

    With a valid cookie that the browser held back (SameSite=Strict on a link followed from
    another site), its script asks /stallscope/session and reloads once, now same-site.
    """
    target = _safe_next(target)
    message = f'<p class="error" role="alert">{html.escape(error)}</p>' if error else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>stallscope · log in</title>
<style>
body {{ font-family: "Source Sans Pro", system-ui, sans-serif; background: #fff; color: #31333f;
  display: flex; justify-content: center; margin: 0; padding-top: 12vh; }}
main {{ width: 22rem; }}
h1 {{ font-size: 2rem; margin: 0 0 .25rem; }}
p {{ color: #5a5c69; }}
label {{ display: block; font-size: .9rem; margin: 1.2rem 0 .3rem; }}
input[type=password] {{ width: 100%; box-sizing: border-box; padding: .55rem .7rem;
  border: 1px solid #d6d6d9; border-radius: .5rem; font-size: 1rem; background: #f0f2f6; }}
button {{ margin-top: 1rem; padding: .5rem 1.2rem; border: 0; border-radius: .5rem;
  background: #ff4b4b; color: #fff; font-size: 1rem; cursor: pointer; }}
.error {{ color: #7d353b; background: #ffecec; padding: .6rem .8rem; border-radius: .5rem; }}
</style></head>
<body><main>
<h1>stallscope</h1>
<p>This team server needs the team token once per browser (the session lasts a week).</p>
{message}
<form method="post" action="{LOGIN_PATH}">
<label for="token">Team token</label>
<input id="token" name="token" type="password" autocomplete="current-password" autofocus required>
<input type="hidden" name="next" value="{html.escape(target, quote=True)}">
<button type="submit">Enter</button>
</form>
</main>
<script>
fetch("{SESSION_PATH}", {{credentials: "same-origin"}}).then(function (r) {{
  var last = Number(sessionStorage.getItem("stallscope-retry") || 0);
  if (r.status === 204 && Date.now() - last > 10000) {{
    sessionStorage.setItem("stallscope-retry", String(Date.now()));
    location.replace({_js_string(target)});
  }}
}});
</script>
</body></html>
""".encode()
