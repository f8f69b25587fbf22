"""Session cookies, the server key and upload quotas (stallscope.access), by hand."""

from __future__ import annotations

import stat

import pytest

from stallscope.access import (
    KEY_FILE_NAME,
    MB,
    SessionSigner,
    Settings,
    UploadQuota,
    server_key,
    token_matches,
)

KEY = b"k" * 32
NOW = 1_800_000_000.0
WEEK = 7 * 24 * 3600


def test_a_cookie_verifies_until_it_expires():
    signer = SessionSigner(KEY)
    cookie = signer.issue(WEEK, now=NOW)
    session = signer.verify(cookie, now=NOW + 1)
    assert session is not None and session.expires_at == int(NOW) + WEEK
    assert signer.verify(cookie, now=NOW + WEEK - 1) == session
    assert signer.verify(cookie, now=NOW + WEEK) is None  # expired at its second
    assert signer.verify(cookie, now=NOW + 10 * WEEK) is None


def test_each_login_gets_its_own_id():
    signer = SessionSigner(KEY)
    first, second = (signer.verify(signer.issue(WEEK, now=NOW), now=NOW) for _ in range(2))
    assert first.login_id != second.login_id


def test_a_cookie_signed_under_another_key_is_refused():
    cookie = SessionSigner(b"a" * 32).issue(WEEK, now=NOW)
    assert SessionSigner(b"b" * 32).verify(cookie, now=NOW) is None


@pytest.mark.parametrize("part", [1, 2, 3])
def test_a_tampered_cookie_is_refused(part):
    signer = SessionSigner(KEY)
    parts = signer.issue(WEEK, now=NOW).split(".")
    if part == 1:
        parts[1] = str(int(parts[1]) + 10 * WEEK)  # a later expiry, same mac
    else:
        parts[part] = ("0" if parts[part][0] != "0" else "1") + parts[part][1:]
    assert signer.verify(".".join(parts), now=NOW) is None


@pytest.mark.parametrize(
    "value", [None, "", "v1", "v1.1.2", "v2.9999999999.ab.cd", "x" * 300, "v1.a.b.c.d"]
)
def test_garbage_is_refused(value):
    assert SessionSigner(KEY).verify(value, now=NOW) is None


def test_server_key_is_kept_in_the_store_and_follows_the_token(tmp_path):
    key = server_key("tok", tmp_path)
    secret_file = tmp_path / KEY_FILE_NAME
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert server_key("tok", tmp_path) == key  # another server, or a restart, on the store
    assert server_key("other", tmp_path) != key  # a new token logs everyone out
    assert server_key("tok", tmp_path / "elsewhere") != key  # another store, another secret


def test_server_key_without_a_writable_store_is_per_process(tmp_path, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    first, second = server_key("tok", blocked), server_key("tok", blocked)
    assert first != second and len(first) == 32
    assert "sessions will end when the server stops" in capsys.readouterr().err


def test_token_matches():
    assert token_matches("s3cret", "s3cret")
    assert not token_matches("s3cre", "s3cret")
    assert not token_matches("", "")
    assert not token_matches(None, "s3cret")


def test_quota_counts_bytes_in_a_sliding_window():
    quota = UploadQuota(limit_bytes=10 * MB, window_s=3600, max_files=5)
    assert quota.admit("ana", 6 * MB, files_held=0, now=0) is None
    reason = quota.admit("ana", 5 * MB + MB // 2, files_held=1, now=100)
    assert reason == (
        "Upload refused: quota of 10 MB per 60 min reached (6 MB used, this file 5.5 MB); "
        "try again in 58 min."
    )
    assert quota.admit("bo", 5 * MB, files_held=0, now=100) is None  # per user
    assert quota.admit("ana", 4 * MB, files_held=1, now=100) is None  # exactly the limit
    assert quota.used_bytes("ana", now=100) == 10 * MB
    assert quota.used_bytes("ana", now=3600) == 4 * MB  # the first upload left the window
    assert quota.admit("ana", 6 * MB, files_held=0, now=3600) is None


def test_a_file_larger_than_the_whole_quota_says_so():
    quota = UploadQuota(limit_bytes=10 * MB, window_s=3600, max_files=5)
    reason = quota.admit("ana", 12 * MB, files_held=0, now=0)
    assert reason == (
        "Upload refused: this file (12 MB) is larger than the upload quota of 10 MB per 60 min."
    )


def test_quota_refund_gives_back_a_failed_upload():
    quota = UploadQuota(limit_bytes=10 * MB, window_s=60, max_files=5)
    assert quota.admit("ana", 8 * MB, files_held=0, now=0) is None
    quota.refund("ana", 8 * MB)
    assert quota.used_bytes("ana", now=1) == 0
    assert quota.admit("ana", 9 * MB, files_held=0, now=1) is None


def test_quota_caps_files_held():
    quota = UploadQuota(limit_bytes=10 * MB, window_s=60, max_files=2)
    reason = quota.admit("ana", 1, files_held=2, now=0)
    assert reason.startswith("Upload refused: you already hold 2 uploaded files")
    assert quota.used_bytes("ana", now=0) == 0  # nothing charged
    assert quota.admit("ana", 1, files_held=1, now=0) is None


def test_settings_defaults_and_environment():
    assert Settings.from_env({}) == Settings()
    s = Settings.from_env(
        {
            "STALLSCOPE_TOKEN": "t",
            "STALLSCOPE_SESSION_DAYS": "0.5",
            "STALLSCOPE_UPLOAD_QUOTA_MB": "100",
            "STALLSCOPE_UPLOAD_QUOTA_MINUTES": "10",
            "STALLSCOPE_UPLOAD_MAX_FILES": "3",
            "STALLSCOPE_COOKIE_SECURE": "1",
        }
    )
    assert (s.token, s.session_s, s.quota_bytes, s.quota_window_s, s.max_files) == (
        "t",
        12 * 3600,
        100 * MB,
        600,
        3,
    )
    assert s.cookie_secure


@pytest.mark.parametrize("value", ["0", "-1", "lots"])
def test_settings_refuse_bad_values(value):
    with pytest.raises(ValueError, match="STALLSCOPE_UPLOAD_QUOTA_MB"):
        Settings.from_env({"STALLSCOPE_UPLOAD_QUOTA_MB": value})
