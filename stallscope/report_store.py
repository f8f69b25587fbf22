"""Reports computed once and stored next to their job (``jobs/<job_id>/reports/``).

A job's report (``stallscope.report/1``, what ``build_report(store, [refs])``
returns for its whole set of traces) depends only on the job's immutable
Parquet files, the analyzers' settings and the code. It is stored under a key
made of exactly those, so a stored report is either the right one or not
found::

    jobs/<job_id>/reports/<key>/meta.json    key, versions, settings, summary, report size and hash
    jobs/<job_id>/reports/<key>/report.json  the report

The key (:func:`report_key`) is the BLAKE2b hash (16 bytes, hex) of the
canonical JSON of: this stored format (:data:`STORED_FORMAT`), the report
schema, the stallscope version, :func:`code_fingerprint` (a hash of every
``.py`` file of the packages ``stallscope``, ``stallscope.analyzers`` and
``stallscope.ingest``: any code change gives new keys), the DuckDB version,
the job's trace ids, the *effective* thresholds of every analyzer (defaults
merged with overrides: an override equal to the default is the default's
key), the other settings carried in the overrides (a regex: as given), and
the values of the environment variables of :data:`ANALYSIS_ENV`. A different setting or code is a different key; the old
report stays unread until pruned (at most :data:`KEEP_PER_JOB` per job, the
oldest go first).

Writing (:func:`save`) is the store's publish: both files are written into
a fresh ``staging/`` folder, fsync'ed, and renamed into ``reports/<key>``
(``reports/`` fsync'ed after). A reader sees a whole report or none. Two
writers of one key: the first rename wins, the other's copy is dropped. A
stored report that fails its checks (unreadable JSON, another key, a size or
hash that does not match :func:`meta.json`'s, no typed ``tables``: written
before they existed) is never returned: it is
treated as missing, and the next :func:`save` replaces it. Reports live in
the job's folder, so removing the job (``stallscope rm``) removes them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stallscope.store import Lease, Store, TraceRef, _fsync_dir, _read_json, sync_tree

STORED_FORMAT = "stallscope-stored-report/1"
REPORTS = "reports"
KEEP_PER_JOB = 16  # reports kept per job (settings explored in the dashboard); the oldest go
CODE_PACKAGES = ("stallscope", "stallscope.analyzers", "stallscope.ingest")
# Environment variables that change what the analyzers find (a fallback for a setting): each is
# part of the key. A new one must be added here.
ANALYSIS_ENV = ("STALLSCOPE_ITERATION_RANGE",)

Overrides = dict[str, dict[str, Any]]


# -- the key -------------------------------------------------------------------------
@functools.cache
def code_fingerprint() -> str:
    """A hash of the source of every module that can change a report (hex, 16 bytes).

    Every ``.py`` file under the folders of :data:`CODE_PACKAGES` (found
    without importing them), by relative path and content; the dashboard's
    pages are not among them. Computed once per process (~10 ms).
    """
    import importlib.util

    digest = hashlib.blake2b(digest_size=16)
    for package in CODE_PACKAGES:
        spec = importlib.util.find_spec(package)
        for root in list(spec.submodule_search_locations or []) if spec else []:
            for path in sorted(Path(root).rglob("*.py")):
                digest.update(f"{package}/{path.relative_to(root).as_posix()}\0".encode())
                digest.update(path.read_bytes())
                digest.update(b"\0")
    return digest.hexdigest()


def effective_settings(overrides: Overrides | None = None) -> dict[str, dict[str, float]]:
    """Every analyzer's thresholds as they will be used: defaults merged with ``overrides``."""
    from stallscope.analyzers import all_specs

    overrides = overrides or {}
    return {spec.id: spec.params(overrides.get(spec.id)) for spec in all_specs() if spec.thresholds}


def key_parts(trace_ids: Iterable[str], overrides: Overrides | None = None) -> dict[str, Any]:
    """What a stored report's key is made of (see the module docstring)."""
    import duckdb

    from stallscope import __version__
    from stallscope.report import REPORT_SCHEMA

    settings = effective_settings(overrides)
    return {
        "format": STORED_FORMAT,
        "schema": REPORT_SCHEMA,
        "stallscope": __version__,
        "code": code_fingerprint(),
        "duckdb": duckdb.__version__,
        "traces": sorted(trace_ids),
        "settings": settings,
        "other_settings": other_settings(overrides, settings),
        "environment": {name: os.environ.get(name, "").strip() for name in ANALYSIS_ENV},
    }


def other_settings(overrides: Overrides | None, settings: dict[str, dict[str, float]]) -> dict:
    """The overrides that are not declared thresholds (job settings carried in the same dict,
    such as the inference analyzer's ``iteration_range`` regex), as given; empty ones dropped."""
    out: dict[str, dict[str, Any]] = {}
    for analyzer, values in (overrides or {}).items():
        for name, value in (values or {}).items():
            if name in settings.get(analyzer, {}) or value is None or str(value).strip() == "":
                continue
            out.setdefault(analyzer, {})[name] = value.strip() if isinstance(value, str) else value
    return out


def report_key(trace_ids: Iterable[str], overrides: Overrides | None = None) -> str:
    """The key of the report of these traces with these threshold overrides (32 hex digits)."""
    text = json.dumps(key_parts(trace_ids, overrides), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


# -- reading -------------------------------------------------------------------------
def reports_dir(store: Store, job_id: str) -> Path:
    return store.jobs_dir / job_id / REPORTS


def load(store: Store, job_id: str, key: str) -> dict[str, Any] | None:
    """The stored report of ``key``, or None when it is missing or fails any check."""
    folder = reports_dir(store, job_id) / key
    meta = _valid_meta(folder, key)
    if meta is None:
        return None
    try:
        data = (folder / "report.json").read_bytes()
    except OSError:
        return None
    if len(data) != meta["report_bytes"] or _hash(data) != meta["report_blake2b"]:
        return None
    try:
        report = json.loads(data)
    except ValueError:
        return None
    return report if _is_report(report) else None


def load_meta(store: Store, job_id: str, key: str) -> dict[str, Any] | None:
    """A stored report's ``meta.json`` (its summary) without reading the report: None when
    missing or damaged (a report file whose size is not the recorded one counts as damaged)."""
    return _valid_meta(reports_dir(store, job_id) / key, key)


def _valid_meta(folder: Path, key: str) -> dict[str, Any] | None:
    meta = _read_json(folder / "meta.json")
    if (
        meta is None
        or meta.get("format") != STORED_FORMAT
        or meta.get("key") != key
        or not isinstance(meta.get("report_bytes"), int)
        or not isinstance(meta.get("report_blake2b"), str)
        or not isinstance(meta.get("summary"), dict)
    ):
        return None
    try:
        if (folder / "report.json").stat().st_size != meta["report_bytes"]:
            return None
    except OSError:
        return None
    return meta


def _is_report(report: Any) -> bool:
    from stallscope.report import REPORT_SCHEMA

    return (
        isinstance(report, dict)
        and report.get("schema") == REPORT_SCHEMA
        and all(isinstance(report.get(k), list) for k in ("traces", "metrics", "findings"))
        # the typed tables (added 2026-12-01) the dashboard reads: a report stored
        # without them is computed again rather than drawn half empty
        and isinstance(report.get("tables"), dict)
    )


def _hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


# -- writing -------------------------------------------------------------------------
def save(
    store: Store,
    job_id: str,
    key: str,
    report: dict[str, Any],
    *,
    overrides: Overrides | None = None,
    elapsed_s: float | None = None,
) -> bool:
    """Store ``report`` under ``key`` for a job (atomically, durably); False when the job is gone.

    A valid report already stored under ``key`` (another writer's) is kept
    and this copy dropped; a damaged one is replaced. Raises OSError when the
    store cannot be written (read-only, full).
    """
    data = json.dumps(report, separators=(",", ":")).encode()
    meta = {
        "format": STORED_FORMAT,
        "key": key,
        "job_id": job_id,
        "created_at": time.time(),
        "elapsed_s": elapsed_s,
        "overrides": overrides or {},
        "key_parts": key_parts([t["id"] for t in report["traces"]], overrides),
        "report_bytes": len(data),
        "report_blake2b": _hash(data),
        "summary": summarize(report),
    }
    staging = store.new_staging()
    try:
        (staging / "report.json").write_bytes(data)
        (staging / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        Lease.release(staging)
        sync_tree(staging)
        return _publish(store, job_id, key, staging)
    finally:
        store.discard(staging)  # (gone already when published)


def _publish(store: Store, job_id: str, key: str, staging: Path) -> bool:
    folder = reports_dir(store, job_id)
    if not (store.jobs_dir / job_id / "job.json").is_file():
        return False
    try:
        folder.mkdir(exist_ok=True)
    except FileNotFoundError:
        return False  # the job was removed meanwhile
    for _ in range(3):
        try:
            os.rename(staging, folder / key)
        except FileNotFoundError:
            return False  # the job was removed meanwhile: its reports with it
        except OSError:
            if load(store, job_id, key) is not None:
                return True  # another writer stored the same report first
            _remove_aside(store, folder / key)  # a damaged one: replaced
            continue
        _fsync_dir(folder)
        prune(store, job_id)
        return True
    return False


def _remove_aside(store: Store, path: Path) -> None:
    """Remove a folder at once (renamed into ``trash/``, then deleted)."""
    doomed = store.trash_dir / f"{os.getpid()}-report-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(path, doomed)
    except OSError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def prune(store: Store, job_id: str, keep: int = KEEP_PER_JOB) -> int:
    """Remove all but a job's ``keep`` newest stored reports (damaged ones first); returns how many."""
    folder = reports_dir(store, job_id)
    try:
        entries = [p for p in folder.iterdir() if p.is_dir()]
    except OSError:
        return 0
    if len(entries) <= keep:
        return 0

    def made(path: Path) -> float:
        meta = _read_json(path / "meta.json") or {}
        when = meta.get("created_at")
        return when if isinstance(when, (int, float)) else 0.0

    doomed = sorted(entries, key=made)[: len(entries) - keep]
    for path in doomed:
        _remove_aside(store, path)
    return len(doomed)


# -- the entry points ------------------------------------------------------------------
def is_whole_job(store: Store, refs: list[TraceRef]) -> bool:
    """Whether ``refs`` are every trace of one job (only whole jobs' reports are stored)."""
    if not refs or len({r.job_id for r in refs}) != 1:
        return False
    have = {r.trace_id for r in store.traces(refs[0].job_id)}
    return have == {r.trace_id for r in refs}


def ensure(
    store: Store,
    refs: list[TraceRef],
    overrides: Overrides | None = None,
    *,
    recompute: bool = False,
) -> tuple[dict[str, Any], str]:
    """A job's report and where it came from: ``"stored"`` (read), ``"computed"`` (and stored),
    or ``"computed, not stored"`` (the store is read-only, or the traces are not a whole job).

    ``recompute`` analyzes even when a valid stored report exists (and stores the new one).
    """
    from stallscope.errors import EnvironmentProblem
    from stallscope.report import build_report

    whole = is_whole_job(store, refs)
    key = report_key([r.trace_id for r in refs], overrides) if whole else ""
    if whole and not recompute:
        stored = load(store, refs[0].job_id, key)
        if stored is not None:
            return stored, "stored"
    start = time.perf_counter()
    report = build_report(store, [refs], overrides)
    if not whole:
        return report, "computed, not stored"
    try:
        saved = save(
            store, refs[0].job_id, key, report,
            overrides=overrides, elapsed_s=round(time.perf_counter() - start, 3),
        )  # fmt: skip
    except (OSError, EnvironmentProblem):  # a read-only or full store: the report still stands
        saved = False
    return report, "computed" if saved else "computed, not stored"


def default_summary(store: Store, job_id: str, trace_ids: Iterable[str]) -> dict[str, Any] | None:
    """The summary of a job's stored report with the default thresholds, or None (not analyzed
    yet, or damaged). Reads ``meta.json`` only: cheap enough for a list of every job."""
    meta = load_meta(store, job_id, report_key(trace_ids))
    return None if meta is None else meta["summary"]


# -- the summary (the Library's columns) ------------------------------------------------
def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """The figures a list of jobs shows, from a report:

    ``worst_severity`` (None without findings) and ``worst_count`` (findings at
    it), ``findings``; ``step_ms_median``: the median step time (ms) of the
    rank whose median is the largest (the Overview's *Step time*; None
    without step markers); ``gpu_busy_pct``: GPU busy %, weighted by each
    rank and GPU's span (the Overview's *GPU busy*; None without GPU
    activity); ``tpot_ms``: for an inference job, the median time per output
    token (ms) of the slowest GPU, else None.
    """
    from stallscope.analyzers.base import SEVERITY_RANK
    from stallscope.compare_inference import inference_summary

    findings = report.get("findings", [])
    worst = max((f["severity"] for f in findings), key=SEVERITY_RANK.__getitem__, default=None)
    decode = inference_summary(report)
    step = step_time_ms(report)
    return {
        "worst_severity": worst,
        "worst_count": sum(1 for f in findings if f["severity"] == worst),
        "findings": len(findings),
        "step_ms_median": None if step is None else step[0],
        "gpu_busy_pct": gpu_busy_pct(report),
        "tpot_ms": None if decode is None else decode["decode_iter_ms_median"],
    }


def step_time_ms(report: dict[str, Any]) -> tuple[float, float, float] | None:
    """(median ms, p90 ms, max/median) of the steps of the rank with the largest median step
    (from the ``step_time_*`` metrics of traces); None without steps."""
    by_trace: dict[str, dict[str, float]] = {}
    for m in report["metrics"]:
        if m["device"] is None and m["name"].startswith("step_time") and m["value"] is not None:
            by_trace.setdefault(m["trace"], {})[m["name"]] = m["value"]
    rows = [r for r in by_trace.values() if "step_time_ms_median" in r]
    if not rows:
        return None
    worst = max(rows, key=lambda r: r["step_time_ms_median"])
    median = worst["step_time_ms_median"]
    return (
        median,
        worst.get("step_time_ms_p90", median),
        worst.get("step_time_max_over_median", 1.0),
    )


def gpu_busy_pct(report: dict[str, Any]) -> float | None:
    """GPU busy % over every rank and GPU with activity, each weighted by its span."""
    rows: dict[tuple, dict[str, float]] = {}
    for m in report["metrics"]:
        if m["device"] is not None and m["name"] in ("gpu_span_ns", "gpu_busy_pct"):
            rows.setdefault((m["trace"], m["rank"], m["device"]), {})[m["name"]] = m["value"]
    spans = [r for r in rows.values() if r.get("gpu_span_ns") is not None]
    total = sum(r["gpu_span_ns"] for r in spans)
    if not spans or not total:
        return None
    busy = sum(
        r["gpu_busy_pct"] * r["gpu_span_ns"] for r in spans if r.get("gpu_busy_pct") is not None
    )
    return busy / total


def store_default_reports(
    store: Store, job_ids: Iterable[str], progress=None
) -> list[tuple[str, str]]:
    """Make sure each job has its report with the default thresholds stored (``ingest`` does this
    after publishing). Returns ``(job_id, outcome)`` per job: ``stored`` (already there),
    ``computed``, ``computed, not stored``, or ``failed: <one line>`` (never raises for a job
    that cannot be analyzed: the job stays, and is analyzed when it is first opened)."""
    from stallscope.errors import StallscopeError, environment_problem

    ids = list(dict.fromkeys(job_ids))
    out = []
    for done, job_id in enumerate(ids):
        if progress:
            progress("analyzing", done, len(ids))
        try:
            refs = store.traces(job_id)
            how = ensure(store, refs)[1] if refs else "failed: the job is gone"
        except StallscopeError as exc:
            how = f"failed: {exc}"
        except OSError as exc:
            how = f"failed: {environment_problem(exc, 'write to the store') or exc}"
        out.append((job_id, how))
    if progress and ids:
        progress("analyzed", len(ids), len(ids))
    return out
