"""Team-server access control, headless: session cookies and per-user upload quotas.

The dashboard's HTTP gate (``stallscope.pages.gate``) and its page gate
(``stallscope.pages.main.authorized``) share these pieces; nothing here
imports Streamlit or a web framework.

* A **session cookie** proves that its browser once presented the team token
  (``$STALLSCOPE_TOKEN``). Its value is ``v1.<expires>.<login_id>.<mac>``:
  ``expires`` in integer seconds since the epoch, ``login_id`` a random id per
  login (the key of that browser's upload quota), ``mac`` the hex
  HMAC-SHA256 of ``v1.<expires>.<login_id>`` under the server key.
* The **server key** is HMAC-SHA256(random secret kept in the store folder,
  token): every server on the same store and token accepts the same cookies,
  restarting keeps people logged in, and changing the token logs everyone out.
* An **upload quota** caps, per user, the bytes uploaded in a sliding time
  window and the uploaded files held in server memory at once.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

COOKIE_NAME = "stallscope_session"
KEY_FILE_NAME = "access.key"
_VERSION = "v1"
MB = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    """Access settings, from the environment (see docs/security.md)."""

    token: str = ""
    session_s: int = 7 * 24 * 3600
    quota_bytes: int = 4096 * MB
    quota_window_s: int = 3600
    max_files: int = 64
    cookie_secure: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """``STALLSCOPE_TOKEN``; ``STALLSCOPE_SESSION_DAYS`` (7); ``STALLSCOPE_UPLOAD_QUOTA_MB``
        (4096) per ``STALLSCOPE_UPLOAD_QUOTA_MINUTES`` (60); ``STALLSCOPE_UPLOAD_MAX_FILES`` (64);
        ``STALLSCOPE_COOKIE_SECURE`` (0; 1 behind an HTTPS proxy). Raises ValueError on a
        value that is not a positive number."""
        env = os.environ if env is None else env

        def positive(name: str, default: float) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number") from None
            if value <= 0:
                raise ValueError(f"{name}={raw!r} must be greater than 0")
            return value

        return cls(
            token=env.get("STALLSCOPE_TOKEN", ""),
            session_s=int(positive("STALLSCOPE_SESSION_DAYS", 7) * 24 * 3600),
            quota_bytes=int(positive("STALLSCOPE_UPLOAD_QUOTA_MB", 4096) * MB),
            quota_window_s=int(positive("STALLSCOPE_UPLOAD_QUOTA_MINUTES", 60) * 60),
            max_files=int(positive("STALLSCOPE_UPLOAD_MAX_FILES", 64)),
            cookie_secure=env.get("STALLSCOPE_COOKIE_SECURE", "") in {"1", "true", "yes"},
        )


def server_key(token: str, store_root: Path | None) -> bytes:
    """The cookie-signing key: HMAC-SHA256(the store's random secret, token).

    The secret is ``<store>/access.key`` (32 random bytes, hex, mode 0600), made on
    first use. Where the store folder cannot hold it, a random per-process secret is
    used instead (cookies then end with the server process) and a line says so on stderr.
    """
    secret = _store_secret(store_root) if store_root is not None else None
    if secret is None:
        print(
            "stallscope: no writable store folder for access.key; "
            "sessions will end when the server stops",
            file=sys.stderr,
        )
        secret = secrets.token_bytes(32)
    return hmac.new(secret, b"stallscope-session\0" + token.encode(), hashlib.sha256).digest()


def _store_secret(store_root: Path) -> bytes | None:
    path = store_root / KEY_FILE_NAME
    try:
        store_root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError:
        return None
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    try:
        text = path.read_text().strip()
        return bytes.fromhex(text) if len(text) >= 64 else None
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Session:
    """What a valid cookie says: its login id and when it expires (seconds since the epoch)."""

    login_id: str
    expires_at: int


class SessionSigner:
    """Issues and verifies session cookies under one key (see the module docstring)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("the session key must be at least 16 bytes")
        self._key = key

    def _mac(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()

    def issue(self, lifetime_s: int, now: float | None = None) -> str:
        """A new cookie value for a fresh login id, valid for ``lifetime_s`` seconds from ``now``."""
        now = time.time() if now is None else now
        payload = f"{_VERSION}.{int(now) + int(lifetime_s)}.{secrets.token_hex(12)}"
        return f"{payload}.{self._mac(payload)}"

    def verify(self, value: str | None, now: float | None = None) -> Session | None:
        """The session of a cookie value, or None when it is missing, malformed, signed
        under another key, tampered with, or expired at ``now``."""
        if not value or len(value) > 200:
            return None
        parts = value.split(".")
        if len(parts) != 4 or parts[0] != _VERSION:
            return None
        payload, mac = ".".join(parts[:3]), parts[3]
        if not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            return None
        try:
            expires_at = int(parts[1])
        except ValueError:
            return None
        now = time.time() if now is None else now
        if expires_at <= now:
            return None
        return Session(login_id=parts[2], expires_at=expires_at)


def token_matches(offered: str | None, token: str) -> bool:
    """Constant-time comparison of an offered token with the server's (empty never matches)."""
    return bool(offered) and bool(token) and hmac.compare_digest(offered.encode(), token.encode())


class UploadQuota:
    """Per-user upload accounting: bytes uploaded in a sliding window of ``window_s``
    seconds (at most ``limit_bytes``) and uploaded files held at once (at most
    ``max_files``; the caller counts them, since the web server holds the files).

    Thread-safe. A user is any string key (a cookie's login id, or a session id on an
    open server).
    """

    def __init__(self, limit_bytes: int, window_s: int, max_files: int) -> None:
        self.limit_bytes, self.window_s, self.max_files = limit_bytes, window_s, max_files
        self._events: dict[str, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()

    def _expire(self, user: str, now: float) -> deque[tuple[float, int]]:
        """``user``'s charges still in the window (a user with none is forgotten)."""
        events = self._events.pop(user, deque())
        while events and events[0][0] <= now - self.window_s:
            events.popleft()
        if events:
            self._events[user] = events
        return events

    def used_bytes(self, user: str, now: float | None = None) -> int:
        """Bytes ``user`` uploaded in the window ending at ``now``."""
        now = time.time() if now is None else now
        with self._lock:
            return sum(size for _, size in self._expire(user, now))

    def admit(self, user: str, size: int, files_held: int, now: float | None = None) -> str | None:
        """Charge an upload of ``size`` bytes to ``user`` and return None, or return the
        one-line reason it is refused (nothing charged)."""
        now = time.time() if now is None else now
        with self._lock:
            if files_held >= self.max_files:
                return (
                    f"Upload refused: you already hold {files_held} uploaded files on the "
                    f"server (limit {self.max_files}); ingest or remove some first."
                )
            quota = f"{_mb(self.limit_bytes)} per {_minutes(self.window_s)}"
            if size > self.limit_bytes:
                return f"Upload refused: this file ({_mb(size)}) is larger than the upload quota of {quota}."
            events = self._expire(user, now)
            used = sum(s for _, s in events)
            if used + size > self.limit_bytes:
                wait_s = events[0][0] + self.window_s - now
                return (
                    f"Upload refused: quota of {quota} reached ({_mb(used)} used, this file "
                    f"{_mb(size)}); try again in {_minutes(max(wait_s, 60))}."
                )
            events.append((now, size))
            self._events[user] = events
            return None

    def refund(self, user: str, size: int) -> None:
        """Give back the latest charge of ``size`` bytes (an upload that then failed)."""
        with self._lock:
            events = self._events.get(user)
            if not events:
                return
            for i in range(len(events) - 1, -1, -1):
                if events[i][1] == size:
                    del events[i]
                    break
            if not events:
                del self._events[user]


def _mb(size: int) -> str:
    return f"{size / MB:,.1f} MB".replace(".0 MB", " MB")


def _minutes(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    return f"{minutes} min"
