"""Build the versioned report (docs/report-schema.md) for stored jobs.

:func:`build_report` runs the analyzers over jobs and returns a plain dict
in the ``stallscope.report/1`` contract, built from its types
(:mod:`stallscope.report_types`); renderers live in ``render``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

import duckdb
import msgspec

from stallscope import job_settings
from stallscope.analyzers import PER_RANK, all_specs
from stallscope.analyzers.base import SEVERITY_RANK, AnalyzerResult, concatenate
from stallscope.errors import NotFoundError
from stallscope.jobdata import JobData
from stallscope.report_types import REPORT_SCHEMA, DeviceEntry, RankSelection, Report, TraceEntry
from stallscope.store import TABLES, Store, TraceRef


def analyze_job(
    job: JobData,
    overrides: dict[str, dict[str, float]] | None = None,
    ranks: Collection[int] | None = None,
) -> AnalyzerResult:
    """Run every registered analyzer over one job; ``overrides[analyzer][threshold]``.

    ``ranks``: the ranks the ``PER_RANK`` analyzers read (None: all; see
    :mod:`stallscope.rank_triage`); the others always read the whole job.

    The analyzers of ``PER_RANK`` run rank by rank, each rank's together on
    one part (``JobData.rank_parts``: that rank's files alone, freed before the
    next rank), and their ranks' results are joined (``SPEC.combine_ranks``);
    the others run once over the whole job. The result, in report order, is
    the same as every analyzer's ``run`` over the whole job; the work grows
    with the rank count instead of its square.
    """
    job_settings.apply(job, overrides)  # one value per job for every analyzer (and view)
    specs = all_specs()
    params = {spec.id: spec.params((overrides or {}).get(spec.id)) for spec in specs}
    rank_wise = [spec for spec in specs if spec.id in PER_RANK]
    by_rank: dict[str, list[AnalyzerResult]] = {spec.id: [] for spec in rank_wise}
    if rank_wise:
        for part in job.rank_parts():
            if ranks is not None and int(part.traces[0].meta.get("rank") or 0) not in ranks:
                continue  # never queried: its files are not read
            for spec in rank_wise:
                by_rank[spec.id].append(spec.run(part, params[spec.id]))
    combined = AnalyzerResult()
    for spec in specs:
        if spec.id in by_rank:
            result = (spec.combine_ranks or concatenate)(by_rank.pop(spec.id))
        else:
            result = spec.run(job, params[spec.id])
        combined.findings.extend(result.findings)
        combined.metrics.extend(result.metrics)
    return combined


def trace_entry(ref: TraceRef) -> TraceEntry:
    """The report's entry for one stored trace (from its catalog metadata)."""
    meta = ref.meta
    return TraceEntry(
        id=ref.trace_id,
        name=meta.get("name"),
        source=meta.get("source"),
        source_version=meta.get("source_version"),
        job=ref.job_id,
        rank=meta.get("rank"),
        world_size=meta.get("world_size"),
        devices=[
            DeviceEntry(d["device"], d.get("name"), d.get("sm_count"))
            for d in meta.get("devices", [])
        ],
        span_ns=meta.get("span_ns"),
        event_count=meta.get("event_count"),
        kernel_count=meta.get("kernel_count"),
        warnings=list(meta.get("warnings", [])),
    )


def job_report_part(
    store: Store,
    refs: list[TraceRef],
    overrides: dict[str, dict[str, float]] | None = None,
    all_ranks: bool = False,
) -> Report:
    """The report of one job: its traces, metrics, findings (in analyzer order) and, for a
    large job, its rank selection.

    Above ``rank_triage.DETAIL_ALL_UP_TO`` ranks the per-rank analyzers read
    the ranks :func:`~stallscope.rank_triage.select_ranks` picks (every rank
    with ``all_ranks``), and ``rank_selection`` says which and why.

    A stored file that cannot be read (truncated, damaged, or removed while
    this runs) raises :class:`~stallscope.errors.StoreFileCorrupt` or
    :class:`~stallscope.errors.NotFoundError` naming this job: never a raw
    DuckDB error, and never another job's failure.
    """
    from stallscope.rank_triage import select_ranks

    job = JobData(store, refs)
    selection = None
    try:
        selection = select_ranks(job, all_ranks=all_ranks)
        result = analyze_job(job, overrides, None if selection is None else selection.analyzed)
    except duckdb.Error as exc:
        job_id = refs[0].job_id if refs else ""
        if refs and not store.has_job(job_id):  # removed meanwhile: whatever DuckDB said
            raise NotFoundError(f"job {job_id} was removed while it was being read") from None
        if not isinstance(exc, (duckdb.IOException, duckdb.InvalidInputException)):
            raise  # a bug, not the store
        raise unreadable_job(store, refs, exc) from None
    finally:
        job.close()
    if refs and not store.has_job(refs[0].job_id):  # removed while read: its views were empty
        raise NotFoundError(f"job {refs[0].job_id} was removed while it was being read")
    return Report(
        schema=REPORT_SCHEMA,
        traces=[trace_entry(r) for r in job.traces],
        metrics=result.metrics,
        findings=[f.to_entry() for f in result.findings],
        rank_selection=[]
        if selection is None
        else [msgspec.convert(selection.to_dict(job.job_id), RankSelection)],
    )


def unreadable_job(store: Store, refs: list[TraceRef], exc: Exception) -> Exception:
    """The one-line error for a job whose stored files DuckDB could not read."""
    import pyarrow.parquet as pq

    from stallscope.errors import StoreFileCorrupt

    job_id = refs[0].job_id if refs else "?"
    if not store.has_job(job_id):
        return NotFoundError(f"job {job_id} was removed while it was being read")
    for ref in refs:
        for table in TABLES:
            path = ref.table_path(table)
            if not path.is_file():
                continue
            try:
                pq.read_metadata(path)
            except Exception as bad:  # noqa: BLE001 (any failure to read the footer says corrupt)
                reason = (
                    str(bad).strip().splitlines()[0] if str(bad).strip() else type(bad).__name__
                )
                return StoreFileCorrupt(
                    f"job {job_id}: stored file {path} is unreadable ({reason}); "
                    f"remove the job (stallscope rm {job_id}) and ingest its traces again"
                )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StoreFileCorrupt(f"job {job_id}: its stored files cannot be read ({first})")


def stored_job_part(
    store: Store,
    refs: list[TraceRef],
    overrides: dict[str, dict[str, float]] | None = None,
    all_ranks: bool = False,
) -> Report:
    """A job's report like :func:`job_report_part`, read from its stored report when one
    matches (code, settings, traces), else computed and stored (``stallscope.report_store``).
    Stored reports are of the default rank selection: ``all_ranks`` is not served from them."""
    from stallscope import report_store

    if all_ranks:
        return job_report_part(store, refs, overrides, all_ranks)
    return msgspec.convert(report_store.ensure(store, refs, overrides)[0], Report)


def _part_in_worker(
    store_root: str,
    job_id: str,
    trace_ids: list[str],
    overrides,
    all_ranks: bool = False,
    reuse: bool = False,
) -> Report:
    """``job_report_part`` in a worker process (arguments are picklable names, not refs)."""
    store = Store(store_root)
    wanted = set(trace_ids)
    refs = [r for r in store.traces(job_id) if r.trace_id in wanted]
    part_of = stored_job_part if reuse and not all_ranks else job_report_part
    return part_of(store, refs, overrides, all_ranks)


@contextmanager
def _pool(executor: Executor | None, workers: int) -> Iterator[Executor]:
    if executor is not None:
        yield executor
        return
    with process_pool(workers) as pool:
        yield pool


def process_pool(workers: int) -> ProcessPoolExecutor:
    """Worker processes started fresh (spawn): never fork a process holding DuckDB threads."""
    import multiprocessing

    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def build_report(
    store: Store,
    jobs: Iterable[list[TraceRef]],
    overrides: dict[str, dict[str, float]] | None = None,
    *,
    workers: int = 1,
    executor: Executor | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    all_ranks: bool = False,
    reuse: bool = False,
) -> dict[str, Any]:
    """Report over several jobs (each a list of its traces).

    ``all_ranks``: the per-rank analyzers read every rank of every job (else a
    job above ``rank_triage.DETAIL_ALL_UP_TO`` ranks gets two-tier triage and
    the report a ``rank_selection`` entry).

    With several jobs and ``executor`` (a process pool) or ``workers > 1``,
    jobs are analyzed in parallel processes; the report is the same as a
    sequential run's. With ``reuse`` (and not ``all_ranks``), a whole job's
    stored report is read when it matches, and a job analyzed here has its
    report stored (:func:`stored_job_part`); the report is the same either way.
    """
    part_of = stored_job_part if reuse and not all_ranks else job_report_part
    jobs = [refs for refs in jobs if refs]
    parts: list[Report] = []
    if workers > 1 and len(jobs) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        context = multiprocessing.get_context(
            "spawn"
        )  # never fork a process holding DuckDB threads
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
            futures = {
                pool.submit(
                    _part_in_worker,
                    str(store.root),
                    refs[0].job_id,
                    [r.trace_id for r in refs],
                    overrides,
                    all_ranks,
                    reuse,
                ): index
                for index, refs in enumerate(jobs)
            }
            by_index: dict[int, Report] = {}
            for done, future in enumerate(as_completed(futures), start=1):
                by_index[futures[future]] = future.result()
                if progress:
                    progress("analyzed", done, len(jobs))
            parts = [by_index[i] for i in range(len(jobs))]
    else:
        for done, refs in enumerate(jobs, start=1):
            parts.append(part_of(store, refs, overrides, all_ranks))
            if progress:
                progress("analyzed", done, len(jobs))
    report = Report(schema=REPORT_SCHEMA, traces=[], metrics=[], findings=[])
    for part in parts:
        report.traces.extend(part.traces)
        report.metrics.extend(part.metrics)
        report.findings.extend(part.findings)
        report.rank_selection.extend(part.rank_selection)
    report.findings.sort(key=lambda f: (-SEVERITY_RANK[f.severity], -f.impact_ns, f.id))
    return report.to_dict()


def worst_severity(report: dict[str, Any]) -> str | None:
    findings = report.get("findings", [])
    if not findings:
        return None
    return max((f["severity"] for f in findings), key=lambda s: SEVERITY_RANK[s])
