"""The Python API for notebooks: ``job = stallscope.load(path_or_id)``.

:func:`load` ingests trace files (or looks up a stored trace or job id) and
returns a :class:`Job`: its findings and metrics as pandas DataFrames, the
report dict (the ``stallscope.report/1`` contract, docs/report-schema.md)
and read-only SQL over the job's canonical tables (docs/schema.md).
Documented in docs/api.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import pandas as pd

from stallscope.errors import InputError
from stallscope.store import Store, TraceRef

FINDING_COLUMNS = (
    "severity", "analyzer", "title", "impact_ms", "trace", "rank", "device", "detail",
    "recommendation", "impact_ns", "saving_ns", "id", "evidence", "windows",
)  # fmt: skip
METRIC_COLUMNS = ("trace", "rank", "device", "name", "value", "unit")
TRACE_COLUMNS = (
    "id", "name", "source", "source_version", "job", "rank", "world_size", "devices", "span_ns",
    "event_count", "kernel_count",
)  # fmt: skip


def load(
    target: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    store: Store | str | os.PathLike[str] | None = None,
    thresholds: dict[str, dict[str, float]] | None = None,
    trusted: bool = False,
) -> Job:
    """One job from trace files or a store id.

    ``target`` is a trace file, a directory or ``.zip`` of a job's ranks, a list
    of files (the ranks of one job), a quoted glob pattern, or a stored trace
    id, job id or unique prefix of either (looked up as ``stallscope analyze``
    looks up its ids: :meth:`stallscope.store.Store.resolve`). Files are ingested
    into ``store`` (a :class:`Store`, a folder, or by default ``$STALLSCOPE_STORE``,
    else ``~/.stallscope/store``); ingesting the same files again finds the stored
    job. ``thresholds`` overrides analyzer thresholds:
    ``{"gpu_idle": {"share_pct_high": 20}}``. Targets that make more than one job
    are an InputError.

    Files are ingested in a child process under the ingest's wall-time and memory
    limits (``$STALLSCOPE_INGEST_TIMEOUT``, ``$STALLSCOPE_INGEST_MAX_MEMORY_MB``), as
    ``stallscope ingest`` and the dashboard do: past a limit, :class:`InputError`
    with the one-line reason. ``trusted=True`` ingests in this process instead,
    without those limits (no process start-up: for your own files).
    """
    st = store if isinstance(store, Store) else Store(store)
    st.ensure()
    if isinstance(target, (str, os.PathLike)):
        targets = [os.fspath(target)]
    else:
        targets = [os.fspath(t) for t in target]
    if not targets:
        raise InputError("load", "nothing to load")
    from stallscope.targets import expand_globs

    targets = expand_globs(targets)
    existing = [t for t in targets if os.path.exists(t)]
    if existing:
        missing = [t for t in targets if t not in existing]
        if missing:
            raise InputError(missing[0], "no such file or directory")
        results = _ingest(st, existing, trusted)
        if len(results) != 1:
            names = ", ".join(r.job_name for r in results)
            raise InputError(
                targets[0],
                f"these targets make {len(results)} jobs ({names}); load them one by one",
            )
        refs = st.traces(results[0].job_id)
    else:
        if len(targets) != 1:
            raise InputError(targets[0], "no such file or directory")
        refs = st.resolve(targets[0])
    return Job(st, refs, thresholds)


def _ingest(store: Store, paths: list[str], trusted: bool):
    """``paths`` ingested as one call of ``stallscope ingest`` (in a limited child process),
    or in this process when ``trusted``."""
    if trusted:
        from stallscope.ingest import ingest_paths

        return ingest_paths(store, paths)
    from stallscope.ingest_child import ingest_in_child

    return ingest_in_child(str(store.root), paths)


class Job:
    """One job (its traces, one per rank) in a store, with its analysis."""

    def __init__(
        self,
        store: Store,
        refs: list[TraceRef],
        thresholds: dict[str, dict[str, float]] | None = None,
    ):
        self.store = store
        self.refs = sorted(refs, key=lambda r: r.meta.get("rank") or 0)
        self.job_id = self.refs[0].job_id if self.refs else ""
        self.thresholds = thresholds

    def __repr__(self) -> str:
        names = ", ".join(str(r.meta.get("name")) for r in self.refs[:3])
        more = f", … ({len(self.refs)} traces)" if len(self.refs) > 3 else ""
        return f"<stallscope.Job {self.job_id} [{names}{more}] in {self.store.root}>"

    @property
    def trace_ids(self) -> list[str]:
        return [r.trace_id for r in self.refs]

    @cached_property
    def report(self) -> dict[str, Any]:
        """The report dict (``stallscope.report/1``), computed once."""
        from stallscope.report import build_report

        return build_report(self.store, [self.refs], self.thresholds)

    @property
    def traces(self) -> pd.DataFrame:
        """One row per trace (rank): the report's ``traces`` entries."""
        return pd.DataFrame(self.report["traces"], columns=list(TRACE_COLUMNS))

    @property
    def findings(self) -> pd.DataFrame:
        """One row per finding, worst first; ``impact_ms`` added for reading."""
        rows = [dict(f, impact_ms=f["impact_ns"] / 1e6) for f in self.report["findings"]]
        return pd.DataFrame(rows, columns=list(FINDING_COLUMNS))

    @property
    def metrics(self) -> pd.DataFrame:
        """One row per metric value (docs/metrics.md); ``device`` is None for per-trace metrics."""
        return pd.DataFrame(self.report["metrics"], columns=list(METRIC_COLUMNS))

    def table(self, name: str) -> pd.DataFrame:
        """One of the report's typed tables (``kernels``, ``steps``, ...: docs/report-schema.md)
        as a DataFrame, its columns those of the table's row type; ValueError for another name."""
        from stallscope.report_types import Tables

        if name not in Tables.__struct_fields__:
            raise ValueError(
                f"no table {name!r}; the report's tables: {', '.join(Tables.__struct_fields__)}"
            )
        return pd.DataFrame(self.report["tables"][name], columns=_table_columns(name))

    def metric(self, name: str, device: int | None = None) -> Any:
        """The value of one metric (first trace, ``device`` when given), else None."""
        for m in self.report["metrics"]:
            if m["name"] == name and (device is None or m["device"] == device):
                return m["value"]
        return None

    def sql(
        self, query: str, *, max_rows: int | None = None, timeout_s: float = 300.0
    ) -> pd.DataFrame:
        """One read-only ``SELECT`` over this job's canonical tables (docs/schema.md:
        ``gpu``, ``host``, ``memory``...) and ``catalog``.

        Runs in the same sandbox process as the dashboard's SQL page, without its row,
        result-size and load caps, and with up to half the machine's memory."""
        from stallscope.sql import MEMORY_MB, readonly_query

        return readonly_query(
            self.store,
            query,
            timeout_s=timeout_s,
            max_rows=max_rows,
            max_bytes=None,
            load_cap_bytes=None,
            memory_mb=max(MEMORY_MB, _physical_memory_mb() // 2),
            traces=self.refs,
        )

    def reanalyze(self, thresholds: dict[str, dict[str, float]] | None = None) -> Job:
        """The same traces analyzed with other thresholds (a new Job)."""
        return Job(self.store, self.refs, thresholds)


def _table_columns(name: str) -> list[str]:
    """The columns of table ``name``: its row type's fields, in order."""
    import typing

    from stallscope.report_types import Tables

    (row,) = typing.get_args(typing.get_type_hints(Tables)[name])
    return list(row.__struct_fields__)


def _physical_memory_mb() -> int:
    """The machine's memory in MiB (0 where the OS does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    except (ValueError, OSError, AttributeError):
        return 0
