"""Shared page state: the store, the selected job/trace (synced with the URL),
threshold overrides, and the jobs' reports: stored ones, read (``stallscope.report_store``),
or built by a child process (``stallscope.report_child``). No analysis happens here.

Deep links: ``?job=ID`` or ``?trace=ID`` (a trace id selects its job and that
rank); pages add their own parameters (``window``, ``finding``...).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import streamlit as st

from stallscope.errors import NotFoundError, StallscopeError
from stallscope.store import Store, TraceRef


def get_store() -> Store:
    """The store of ``$STALLSCOPE_STORE`` (one object per path, shared by all sessions)."""
    from stallscope.store import default_store_path

    return _store_at(str(default_store_path()))


@st.cache_resource
def _store_at(path: str) -> Store:
    return Store(path).ensure()


def jobs() -> list[dict[str, Any]]:
    return get_store().jobs()


CURRENT_JOB = "current_job"  # plain session key: survives page changes, unlike widget state
PICKER = "job_picker"
JOB_SCOPED_PARAMS = (
    "trace",
    "window",
    "finding",
    "ranks",
    "event",
)  # URL parameters that name a job's parts


def selected_job(label: str = "Job") -> tuple[dict[str, Any], list[TraceRef]] | None:
    """The job this page shows, and its traces; None when the store is empty.

    The job is a URL fact: ``?job=`` (or ``?trace=``, which selects its job)
    wins; without either (the sidebar's page links carry no parameters) the
    job the session was on stays, and is written back into the URL so that
    reloads, shared links and back/forward keep it. Only with neither does
    the page open the newest job. The sidebar picker changes it.
    """
    store = get_store()
    all_jobs = jobs()
    if not all_jobs:
        st.info("The store is empty: upload a trace on the Library page.")
        return None
    ids = [j["job_id"] for j in all_jobs]
    job_id = _wanted_job(store, ids) or ids[0]
    st.session_state[CURRENT_JOB] = job_id
    if st.query_params.get("job") != job_id:
        st.query_params["job"] = job_id
    st.session_state[PICKER] = job_id  # the picker shows the page's job (set before it exists)
    names = {j["job_id"]: f"{j.get('name')} · {j['job_id']}" for j in all_jobs}
    st.sidebar.selectbox(label, ids, format_func=names.get, key=PICKER, on_change=_picked)
    job = next(j for j in all_jobs if j["job_id"] == job_id)
    return job, store.traces(job_id)


def _wanted_job(store: Store, ids: list[str]) -> str | None:
    """The job named by the URL, else the session's; warns about unknown ids."""
    wanted = st.query_params.get("job")
    trace = st.query_params.get("trace")
    if trace and not wanted:
        try:
            wanted = store.resolve(trace)[0].job_id
        except NotFoundError:
            st.warning(f"No trace {trace!r} in this store.")
    if wanted and wanted not in ids:
        st.warning(
            f"No job {wanted!r} in this store (removed, or a link to another store): pick one."
        )
        wanted = None
    if wanted:
        return wanted
    remembered = st.session_state.get(CURRENT_JOB)
    return remembered if remembered in ids else None


def _picked() -> None:
    """The picker changed: the new job goes into the session and the URL; its old parts go."""
    job_id = st.session_state[PICKER]
    st.session_state[CURRENT_JOB] = job_id
    for name in JOB_SCOPED_PARAMS:
        if name in st.query_params:
            del st.query_params[name]
    st.query_params["job"] = job_id


THRESHOLDS = "threshold_overrides"  # plain session key: kept while another analyzer is shown


def current_overrides() -> dict[str, dict[str, float]]:
    """The session's changed thresholds (set on the overview's panel), without drawing it."""
    return {a: dict(v) for a, v in st.session_state.get(THRESHOLDS, {}).items()}


def threshold_overrides() -> dict[str, dict[str, float]]:
    """Threshold widgets generated from the analyzers' declarations (same as the CLI flags).

    One analyzer's thresholds at a time (a picker chooses which); changed values
    are kept in the session for every analyzer, listed, and can be reset.
    """
    from stallscope.analyzers import all_specs

    specs = {spec.id: spec for spec in all_specs() if spec.thresholds}
    overrides: dict[str, dict[str, float]] = st.session_state.setdefault(THRESHOLDS, {})
    with st.sidebar.expander(
        "Thresholds" + (f" ({_count(overrides)} changed)" if overrides else "")
    ):
        spec = specs[
            st.selectbox(
                "Analyzer", list(specs), format_func=lambda i: specs[i].title, key="thr_analyzer"
            )
        ]
        for t in spec.thresholds:
            value = st.number_input(
                f"{t.name} ({t.unit})",
                min_value=float(t.minimum),
                max_value=None if t.maximum is None else float(t.maximum),
                value=float(overrides.get(spec.id, {}).get(t.name, t.default)),
                help=t.help,
                key=f"thr_{spec.id}_{t.name}",
                on_change=_threshold_changed,  # before the rerun: the count above is current
                args=(spec.id, t.name, t.default),
            )
            _set_override(overrides, spec.id, t.name, value, t.default)
        if overrides:
            st.caption(
                "Changed: "
                + "; ".join(
                    f"{a}.{n} = {v:g}" for a, v_ in overrides.items() for n, v in v_.items()
                )
            )
            if st.button("Reset all thresholds"):
                overrides.clear()
                for key in [k for k in st.session_state if str(k).startswith("thr_")]:
                    del st.session_state[key]
                st.rerun()
    return {a: dict(v) for a, v in overrides.items()}


def _threshold_changed(analyzer: str, name: str, default: float) -> None:
    value = st.session_state[f"thr_{analyzer}_{name}"]
    _set_override(st.session_state.setdefault(THRESHOLDS, {}), analyzer, name, value, default)


def _set_override(
    overrides: dict[str, dict[str, float]], analyzer: str, name: str, value: float, default: float
) -> None:
    if value != default:
        overrides.setdefault(analyzer, {})[name] = value
    elif name in overrides.get(analyzer, {}):
        del overrides[analyzer][name]
        if not overrides[analyzer]:
            del overrides[analyzer]


def _count(overrides: dict[str, dict[str, float]]) -> int:
    return sum(len(v) for v in overrides.values())


def _freeze(overrides: dict[str, dict[str, float]]) -> tuple:
    return tuple(sorted((a, tuple(sorted(v.items()))) for a, v in overrides.items()))


class _NotStored(Exception):
    """No valid stored report (raised, not returned: st.cache_data caches return values only)."""


# Reports are cached as resources: one object shared by every session and rerun, never copied.
# st.cache_data pickles its value when stored and unpickles a copy at every call: for the 14.6 MB
# report of a 1,024-rank job that was ~0.3 s (host) at each rerun of any page. The pages only
# read a report (never change it). Fewer entries than a cache of pickles: a large job's report
# is ~100 MB of Python objects.
REPORTS_KEPT = 16


@st.cache_resource(show_spinner=False, max_entries=REPORTS_KEPT)
def _stored_report(job_id: str, key: str, store_path: str) -> dict[str, Any]:
    """The job's stored report of ``key`` (``stallscope.report_store``); raises _NotStored.
    Shared: callers must not change it."""
    from stallscope.report_store import load

    report = load(Store(store_path), job_id, key)
    if report is None:
        raise _NotStored(key)
    return report


_BUILDING: dict[str, threading.Lock] = {}
_BUILDING_LOCK = threading.Lock()


@st.cache_resource(show_spinner=False, max_entries=REPORTS_KEPT)
def _built_report(job_id: str, key: str, frozen: tuple, store_path: str) -> dict[str, Any]:
    """The report of ``key``, built by a child process (``stallscope.report_child``), which stores
    it; sessions asking for the same report at once wait for one child."""
    from stallscope.report_child import report_in_child
    from stallscope.report_store import load

    with _BUILDING_LOCK:
        lock = _BUILDING.setdefault(key, threading.Lock())
    with lock:
        report = load(Store(store_path), job_id, key)  # another session's child made it meanwhile
        if report is not None:
            return report
        return report_in_child(store_path, job_id, {a: dict(v) for a, v in frozen})


def report_for(
    job_id: str, traces: list[TraceRef], overrides: dict[str, dict[str, float]] | None = None
) -> dict[str, Any]:
    """The whole job's report with these thresholds: the one stored beside the job, else built
    (and stored) by a child process. The analyzers never run in this (the server's) process.
    The report is shared by every session (cached, not copied): read it, never change it.

    A job that cannot be analyzed (damaged, removed meanwhile, past the analysis time limit)
    shows its one-line error and stops the page: other jobs are unaffected.
    """
    from stallscope.report_store import report_key

    root = str(get_store().root)
    key = report_key([r.trace_id for r in traces], overrides)
    try:
        return _stored_report(job_id, key, root)
    except _NotStored:
        pass
    try:
        with st.spinner(
            "Analyzing this job (once: its report is then stored beside it, for everyone)…",
            show_time=True,
        ):
            return _built_report(job_id, key, _freeze(overrides or {}), root)
    except StallscopeError as exc:
        st.error(f"Could not analyze job {job_id}: {exc}")
        st.stop()
        raise  # (st.stop raises; this keeps the type checker sure nothing is returned)


def stored_summaries(jobs_: list[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """job id -> the summary of its stored default-thresholds report (None: not analyzed yet).
    Reads only each report's small ``meta.json``; never analyzes."""
    from stallscope.report_store import default_summary

    store = get_store()
    return {j["job_id"]: default_summary(store, j["job_id"], j.get("trace_ids", [])) for j in jobs_}


def max_upload_mb() -> int:
    return int(os.environ.get("STALLSCOPE_MAX_UPLOAD_MB", "1024"))
