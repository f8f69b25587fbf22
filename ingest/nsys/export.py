"""Nsight Systems reports (``.nsys-rep``, legacy ``.qdrep``): exported to SQLite, then parsed.

stallscope reads nsys's SQLite export. Given a report, it runs
``nsys export --type sqlite`` itself when it can find ``nsys`` (``$STALLSCOPE_NSYS``,
a path or command name, else ``nsys`` on ``PATH``) and keeps the export in a
cache keyed by the report's hash (``$STALLSCOPE_NSYS_CACHE``, else
``$XDG_CACHE_HOME/stallscope/nsys-export``, else ``~/.cache/stallscope/nsys-export``),
so the same report is exported once. Without nsys it fails with the exact
``nsys export`` command to run.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from stallscope.errors import InputError
from stallscope.ingest.formats import ParseContext, ParsedTrace
from stallscope.ingest.nsys.db import SQLITE_MAGIC
from stallscope.ingest.reader import Source

REPORT_MAGIC = b"NVIDIA Tegra Profiler Report"  # header of every .nsys-rep and .qdrep
_REPORT_EXT = re.compile(r"\.(nsys-rep|qdrep)$", re.IGNORECASE)


def is_report(name: str, data: bytes) -> bool:
    """An nsys report by its header, or by its extension (unless it is really SQLite)."""
    if data.startswith(SQLITE_MAGIC):
        return False
    base = name.rsplit(":", 1)[-1]
    return data.startswith(REPORT_MAGIC) or bool(_REPORT_EXT.search(base))


def nsys_executable() -> str | None:
    """The nsys binary to export with, or None."""
    configured = os.environ.get("STALLSCOPE_NSYS", "").strip()
    if configured:
        found = shutil.which(configured)
        return found or (configured if os.access(configured, os.X_OK) else None)
    return shutil.which("nsys")


def cache_dir() -> Path:
    """Where exports of reports are kept (see the module docstring)."""
    env = os.environ.get("STALLSCOPE_NSYS_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "stallscope" / "nsys-export"


def export_command(name: str) -> str:
    """The ``nsys export`` command that makes the SQLite file stallscope reads."""
    path = name if os.path.isfile(name) else name.rsplit(":", 1)[-1].rsplit("/", 1)[-1]
    stem = _REPORT_EXT.sub("", path)
    return f"nsys export --type sqlite -o {shlex.quote(stem + '.sqlite')} {shlex.quote(path)}"


def parse_nsys_report(source: Source, data: bytes, ctx: ParseContext) -> list[ParsedTrace]:
    """Export the report (or reuse its cached export) and parse that export."""
    from stallscope.ingest.nsys.parse import parse_nsys_file

    exe = nsys_executable()
    if exe is None:
        raise InputError(
            source.name,
            "Nsight Systems report: stallscope reads its SQLite export, and nsys was not found "
            f"(PATH or $STALLSCOPE_NSYS) to make it; run: {export_command(source.name)} "
            "and ingest the .sqlite file",
        )
    cached = cache_dir() / f"{source.file_hash}.sqlite"
    if not _is_sqlite(cached):
        _export(exe, source, data, cached, ctx.scratch)
    return parse_nsys_file(cached, source.name, ctx)


def _export(exe: str, source: Source, data: bytes, target: Path, scratch: Path | None) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(source.name, f"cannot create the nsys export cache ({exc})") from None
    partial = target.with_name(f"{target.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.part.sqlite")
    report, temporary = _report_path(source, data, scratch)
    command = [exe, "export", "--type", "sqlite", "--force-overwrite", "true",
               "-o", str(partial), report]  # fmt: skip
    timeout = float(os.environ.get("STALLSCOPE_NSYS_TIMEOUT", "3600"))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0 or not _is_sqlite(partial):
            lines = [ln for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
            detail = lines[-1].strip() if lines else "no output"
            raise InputError(source.name, f"nsys export failed (exit {done.returncode}: {detail})")
        os.replace(partial, target)
    except subprocess.TimeoutExpired:
        raise InputError(source.name, f"nsys export took longer than {timeout:.0f} s") from None
    except OSError as exc:
        raise InputError(source.name, f"cannot run nsys export ({exc})") from None
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()
        if temporary:
            with contextlib.suppress(OSError):
                os.unlink(report)


def _report_path(source: Source, data: bytes, scratch: Path | None) -> tuple[str, bool]:
    """(path of the report for nsys, whether it is a temporary copy to remove).

    A temporary copy lies in ``scratch`` (the ingest's staging folder) when given."""
    name = source.name
    with contextlib.suppress(OSError):
        if os.path.isfile(name) and os.path.getsize(name) == len(data):
            return name, False
    suffix = ".qdrep" if name.lower().endswith(".qdrep") else ".nsys-rep"
    fd, path = tempfile.mkstemp(prefix=".tmp-report-", suffix=suffix, dir=scratch)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path, True


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == SQLITE_MAGIC
    except OSError:
        return False
