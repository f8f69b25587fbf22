"""The team-shared trace store: immutable Parquet per trace, DuckDB to query.

Layout under the store root (see docs/store.md)::

    STORE_VERSION
    jobs/<job_id>/job.json                 job catalog row (immutable)
    jobs/<job_id>/annotations.json         tags and notes (replaced atomically)
    jobs/<job_id>/uploads/<upload_id>.json one per upload of these files (who, when, name, tags, notes)
    jobs/<job_id>/<trace_id>/meta.json     trace catalog row (immutable)
    jobs/<job_id>/<trace_id>/<table>.parquet
    jobs/<job_id>/reports/<key>/           the job's stored reports (stallscope.report_store)
    staging/<pid>-<hostkey>-<random>/      ingests in progress (never read)
    staging/<pid>-<hostkey>-<random>/.lease         owner: host id, pid, heartbeat (see Lease)
    trash/<pid>-<hostkey>-<job_id>-<random>/  deletions in progress (never read), owned by that pid

Concurrency contract: a job becomes visible by one ``rename`` of a complete
staging directory, so readers never see half a job, any number of processes
may ingest at once, and a process killed mid-ingest leaves only a staging
directory that later ingests remove. Nothing is ever modified in place except
``annotations.json``, which is replaced with ``os.replace``.

Uploads: a job is stored once per content but uploaded by many; each upload is
one file in ``uploads/`` (created by ``os.replace`` and read back, removed by
``unlink``), and the job's data goes when its last upload goes
(:meth:`Store.remove_upload`). A path-based call that looked up a job's folder
just before it was renamed into ``trash/`` may complete there afterwards:
removers delete their trash copy until it is gone (:func:`_delete_trash_copy`)
and an upload counts only once read back (:func:`_write_verified`).
A job folder without ``uploads/`` (an older store) counts its ``job.json`` as
one upload; it is turned into an ``uploads/`` folder by one atomic ``rename``
before any upload is added or removed.

Shared stores (NFS, containers): a staging folder is owned by its ``.lease``
(host id, pid, heartbeat refreshed every :data:`HEARTBEAT_S` while the ingest
runs). Another writer removes it only when its heartbeat is older than
:func:`stale_after_s`, or when the lease's host id is this very machine and
PID namespace and its pid is gone: never by a pid alone. Every file and
folder of a job is fsync'ed before the rename that publishes it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from stallscope.errors import NotFoundError, environment_problem
from stallscope.schema import BY_NAME, CATALOG_COLUMNS, EMPTY_SELECTS, TABLE_NAMES
from stallscope.schema import TABLES as _TABLE_DEFS

STORE_FORMAT = "stallscope-store/1"
TABLES = TABLE_NAMES  # the canonical tables, declared in stallscope.schema


def default_store_path() -> Path:
    """``$STALLSCOPE_STORE``, else ``~/.stallscope/store``."""
    env = os.environ.get("STALLSCOPE_STORE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".stallscope" / "store"


@dataclass(frozen=True)
class TraceRef:
    """Where one trace lives, with its catalog row (``meta.json``)."""

    trace_id: str
    job_id: str
    path: Path
    meta: dict[str, Any]

    def table_path(self, table: str) -> Path:
        return self.path / f"{table}.parquet"


class Store:
    """A store folder. Cheap to construct; every call reads the folder afresh."""

    def __init__(self, root: str | os.PathLike[str] | None = None):
        self.root = Path(root).expanduser() if root else default_store_path()
        self.jobs_dir = self.root / "jobs"
        self.staging_dir = self.root / "staging"
        self.trash_dir = self.root / "trash"

    # -- creation and housekeeping -------------------------------------------------
    def ensure(self) -> Store:
        for folder in (self.jobs_dir, self.staging_dir, self.trash_dir):
            folder.mkdir(parents=True, exist_ok=True)
        marker = self.root / "STORE_VERSION"
        if not marker.exists():
            _atomic_write_text(marker, STORE_FORMAT + "\n")
        return self

    def new_staging(self) -> Path:
        """A fresh private folder for one ingest, owned by a live lease; removed by publish or on failure."""
        self.ensure()
        self.clean_stale()
        # The name alone already says who owns the folder (pid and host key), for
        # the moment between mkdir and the first lease write.
        path = self.staging_dir / f"{os.getpid()}-{host_key()}-{uuid.uuid4().hex[:12]}"
        try:
            path.mkdir()
            Lease.write(path)
            Lease.start_heartbeat(path)
        except OSError as exc:
            shutil.rmtree(path, ignore_errors=True)
            raise environment_problem(exc, "write to the store") or exc from None
        return path

    def clean_stale(self) -> None:
        """Remove the staging and trash folders whose owner is gone (see :meth:`Lease.is_stale`).

        A trash folder's owner may still put it back (:meth:`remove_upload`):
        it is never removed while its owner lives. Its owner is the process
        that renamed it into ``trash/``, named by the folder's name
        (:func:`_trash_is_stale`): the ``.lease`` inside may be a loser's of
        that rename (two removers write it in turn, one rename wins).
        """
        for folder in _children(self.staging_dir):
            if Lease.is_stale(folder):
                shutil.rmtree(folder, ignore_errors=True)
        for folder in _children(self.trash_dir):
            if _trash_is_stale(folder):
                shutil.rmtree(folder, ignore_errors=True)

    def _take_away(self, job_id: str) -> Path | None:
        """Rename a job into ``trash/`` (it vanishes at once), owned by a lease written first,
        so no other writer's clean-up removes it while this one may still put it back.
        None when the job is already gone."""
        self.ensure()
        folder = self.jobs_dir / job_id
        doomed = self.trash_dir / f"{os.getpid()}-{host_key()}-{job_id}-{uuid.uuid4().hex[:8]}"
        try:
            Lease.write(folder)
            os.rename(folder, doomed)
        except FileNotFoundError:
            return None
        return doomed

    def publish(self, staging: Path, job_id: str, durable: Collection[Path] = ()) -> bool:
        """Make a complete staging folder visible as ``jobs/<job_id>``.

        Every file and folder below ``staging`` is fsync'ed first, except the
        files in ``durable``: ones their writer already fsync'ed and nobody
        changed since (a Dask worker syncs its rank's files before moving them
        in). Returns False (and discards the staging folder) when that job
        already exists, e.g. because another process ingested the same files
        first.
        """
        target = self.jobs_dir / job_id
        Lease.release(staging)
        sync_tree(staging, durable)
        try:
            os.rename(staging, target)
            _fsync_dir(self.jobs_dir)
        except OSError as exc:
            return self._publish_again(staging, target, exc)
        return True

    def _publish_again(self, staging: Path, target: Path, exc: OSError) -> bool:
        """After a failed publishing rename: False (the staging folder discarded) when the
        job exists; when it was there at the rename (ENOTEMPTY) but is gone at this look
        (removed meanwhile), the rename is tried again; any other error is raised."""
        for _ in range(100):
            if target.exists():
                shutil.rmtree(staging, ignore_errors=True)
                return False
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise exc
            try:
                os.rename(staging, target)
            except OSError as again:
                exc = again
                continue
            _fsync_dir(self.jobs_dir)
            return True
        raise RuntimeError(f"could not publish job {target.name}: it keeps coming and going")

    def discard(self, staging: Path) -> None:
        Lease.release(staging)
        shutil.rmtree(staging, ignore_errors=True)

    # -- catalog -------------------------------------------------------------------
    def has_job(self, job_id: str) -> bool:
        return (self.jobs_dir / job_id / "job.json").is_file()

    def jobs(self) -> list[dict[str, Any]]:
        """Job catalog rows with their annotations, newest first."""
        rows = []
        for folder in _children(self.jobs_dir):
            job = _read_json(folder / "job.json")
            if job is None:
                continue
            rows.append(_job_row(folder, job))
        rows.sort(key=lambda j: (j.get("uploaded_at", ""), j.get("job_id", "")), reverse=True)
        return rows

    def traces(self, job_id: str | None = None) -> list[TraceRef]:
        """Every visible trace (of one job when given), by job then rank."""
        folders = [self.jobs_dir / job_id] if job_id else _children(self.jobs_dir)
        refs = []
        for job_folder in folders:
            if not (job_folder / "job.json").is_file():
                continue
            for folder in _children(job_folder):
                meta = _read_json(folder / "meta.json")
                if meta is not None:
                    refs.append(TraceRef(meta["trace_id"], job_folder.name, folder, meta))
        refs.sort(key=lambda r: (r.meta.get("uploaded_at", ""), r.job_id, r.meta.get("rank", 0)))
        return refs

    def resolve(self, ref: str) -> list[TraceRef]:
        """Traces named by a trace id, a job id, or a unique prefix of either."""
        ref = ref.strip()
        if not ref or not all(c.isalnum() or c in "-_" for c in ref):
            raise NotFoundError(f"{ref!r} is not a trace or job id")
        all_refs = self.traces()
        exact = [r for r in all_refs if r.trace_id == ref] or [
            r for r in all_refs if r.job_id == ref
        ]
        if exact:
            return exact
        by_trace = [r for r in all_refs if r.trace_id.startswith(ref)]
        by_job = sorted({r.job_id for r in all_refs if r.job_id.startswith(ref)})
        if len(by_trace) == 1 and not by_job:
            return by_trace
        if len(by_job) == 1 and not by_trace:
            return [r for r in all_refs if r.job_id == by_job[0]]
        if by_trace or by_job:
            raise NotFoundError(f"{ref!r} is ambiguous: it starts several trace or job ids")
        raise NotFoundError(f"no trace or job {ref!r} in store {self.root}")

    def job(self, job_id: str) -> dict[str, Any]:
        """One job's catalog row (see :func:`_job_row`)."""
        job = _read_json(self.jobs_dir / job_id / "job.json")
        if job is None:
            raise NotFoundError(f"no job {job_id!r} in store {self.root}")
        return _job_row(self.jobs_dir / job_id, job)

    def annotate(
        self,
        job_id: str,
        tags: list[str] | None = None,
        notes: str | None = None,
        name: str | None = None,
    ) -> None:
        """Replace a job's tags, notes and/or name (last writer wins; a blank name is ignored)."""
        folder = self.jobs_dir / job_id
        if not (folder / "job.json").is_file():
            raise NotFoundError(f"no job {job_id!r} in store {self.root}")
        current = _read_json(folder / "annotations.json") or {}
        if tags is not None:
            current["tags"] = sorted({t.strip() for t in tags if t.strip()})
            current["tags_at"] = _now()  # later uploads' tags add to these
        if notes is not None:
            current["notes"] = notes
        if name is not None and name.strip():
            current["name"] = name.strip()
        _atomic_write_text(folder / "annotations.json", json.dumps(current, indent=1))

    def delete_job(self, job_id: str) -> None:
        """Remove a job for everyone: it vanishes atomically, its files are removed after."""
        folder = self.jobs_dir / job_id
        if not (folder / "job.json").is_file():
            raise NotFoundError(f"no job {job_id!r} in store {self.root}")
        doomed = self._take_away(job_id)
        if doomed is None:
            raise NotFoundError(f"no job {job_id!r} in store {self.root}")
        _delete_trash_copy(doomed)

    # -- uploads -------------------------------------------------------------------
    def uploads(self, job_id: str) -> list[dict[str, Any]]:
        """A job's uploads, oldest first (an older store's job: its ``job.json`` as one)."""
        folder = self.jobs_dir / job_id
        job = _read_json(folder / "job.json")
        if job is None:
            raise NotFoundError(f"no job {job_id!r} in store {self.root}")
        return _uploads_of(folder, job)

    def add_upload(self, job_id: str, entry: dict[str, Any]) -> bool:
        """Record one more upload of a stored job; False when the job is gone (removed meanwhile).

        The entry is written beside its final name and renamed into
        ``uploads/``, then read back through ``jobs/<job_id>``: a remover that
        takes the job away at that moment either finds the entry in what it
        took (and puts the job back) or this upload is not recorded (False
        after a wait: the caller ingests the job afresh). The read-back is
        what makes it sure: a rename whose folder was looked up before the
        job was renamed into ``trash/`` may still land there after the
        remover looked (the kernel resolves a path, then locks its last
        folder), so a rename that succeeded proves nothing. Rewriting the same
        entry is harmless: its name is its upload id.
        """
        folder = self.jobs_dir / job_id
        for _ in range(3):
            try:
                _materialize_uploads(folder)
                path = folder / UPLOADS / f"{entry['upload_id']}.json"
                _write_verified(path, entry)
                return True
            except FileNotFoundError:
                self._wait_if_being_put_back(job_id)  # a remover may be putting it back
                if not (folder / "job.json").is_file():
                    return False
        return False

    def remove_upload(self, job_id: str, user: str, *, look_again: bool = True) -> bool:
        """Remove ``user``'s uploads of a job; True when that was the last and the job is gone.

        Raises NotFoundError when ``user`` has no upload of it. The job's data
        goes only with its last upload: the folder is renamed into ``trash/``,
        then looked at again; an upload recorded meanwhile (a re-upload racing
        this removal) puts it back (see :meth:`_restore`). When ``user`` has
        none, a copy of the job in ``trash/`` (being put back, or its uploads
        copied into the job) is waited for and the job looked at once more.
        """
        folder = self.jobs_dir / job_id
        self._wait_if_being_put_back(job_id)
        if not (folder / "job.json").is_file():
            raise NotFoundError(f"no job {job_id!r} in store {self.root}")
        try:
            _materialize_uploads(folder)
        except FileNotFoundError:
            raise NotFoundError(f"no job {job_id!r} in store {self.root}") from None
        mine = [p for p, e in _upload_files(folder / UPLOADS) if e.get("uploaded_by") == user]
        if not mine and look_again and self._wait_while_in_trash(job_id):
            return self.remove_upload(job_id, user, look_again=False)
        if not mine:
            others = sorted({e.get("uploaded_by") or "?" for e in self.uploads(job_id)})
            raise NotFoundError(
                f"job {job_id} has no upload by {user!r} (uploaded by {', '.join(others)}): "
                "pass --user NAME, or --all to delete it for everyone"
            )
        for path in mine:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if _upload_files(folder / UPLOADS):
            return False
        doomed = self._take_away(job_id)
        if doomed is None:
            return True  # another remover took it first
        if _upload_files(doomed / UPLOADS):  # recorded between the look and the rename
            self._restore(doomed, job_id)
            return False
        _delete_trash_copy(doomed)
        return True

    def _in_trash(self, job_id: str) -> bool:
        """Whether a copy of the job is in ``trash/`` (named ``<pid>-<hostkey>-<job_id>-<random>``)."""
        return any(self.trash_dir.glob(f"*-{job_id}-*"))

    def _wait_if_being_put_back(self, job_id: str, timeout_s: float = 5.0) -> None:
        """A job another remover has just taken into ``trash/`` may be put back at once (an
        upload was recorded meanwhile): wait for it to reappear or for the trash copy to go."""
        deadline = time.monotonic() + timeout_s
        while not (self.jobs_dir / job_id / "job.json").is_file() and time.monotonic() < deadline:
            if not self._in_trash(job_id):
                return
            time.sleep(0.01)

    def _wait_while_in_trash(self, job_id: str, timeout_s: float = 5.0) -> bool:
        """Wait until no copy of the job is in ``trash/`` (its remover may be putting it back,
        or copying its uploads into the job ingested afresh); True when one was there."""
        deadline = time.monotonic() + timeout_s
        waited = False
        while self._in_trash(job_id) and time.monotonic() < deadline:
            waited = True
            time.sleep(0.01)
        return waited

    def _restore(self, doomed: Path, job_id: str) -> None:
        """Put a job taken into ``trash/`` back, or (when the same job was ingested afresh
        meanwhile) copy its uploads into that one; never loses an upload.

        The entries are copied (written and read back, :func:`_write_verified`),
        not renamed: a rename into a job that another remover takes away at
        that moment may land in its trash copy after it looked, and be deleted.
        """
        target = self.jobs_dir / job_id
        for _ in range(100):
            try:
                os.rename(doomed, target)
                Lease.release(target)
                return
            except OSError:
                if not target.exists():
                    continue  # it went again between the two looks: try again
            try:
                _materialize_uploads(target)
                for path, entry in _upload_files(doomed / UPLOADS):
                    _write_verified(target / UPLOADS / path.name, entry)
            except FileNotFoundError:
                continue  # that one is being removed too: the loop puts ours back
            _delete_trash_copy(doomed)  # only once every entry is read back from the job
            return
        raise RuntimeError(f"could not put job {job_id} back into the store")

    # -- querying ------------------------------------------------------------------
    def connect(
        self,
        traces: list[TraceRef] | None = None,
        *,
        cursor_of: duckdb.DuckDBPyConnection | None = None,
        load: bool | tuple[str, ...] = False,
        tables: tuple[str, ...] | None = None,
    ) -> duckdb.DuckDBPyConnection:
        """In-memory DuckDB with one view per canonical table over ``traces``.

        With no argument the views cover the whole store. Views read the
        immutable Parquet files directly, so this never blocks a writer.
        With ``cursor_of`` (an open connection this method made over traces that
        include ``traces``, in the same order) the result is a new cursor of
        that connection's database whose views (and ``catalog``) are
        temporary: they shadow the database's own, vanish when the cursor is
        closed, and cost no new database (about 20 ms of CPU each).
        With ``load`` as well, they are temporary tables holding the rows
        (read once, then queried in memory): for many queries on few traces;
        ``load`` a tuple of table names: those tables only, the others stay
        temporary views (a view costs ~4x less to create than a table to load:
        better for a table queried once or twice).
        ``tables``: views of these canonical tables only (default: all; each view's
        creation lists and binds its files, ~0.03 s per table at 1,024 ranks).
        """
        refs = self.traces() if traces is None else traces
        if cursor_of is None:
            con = duckdb.connect(config={"threads": connection_threads()})
            view = "VIEW"
        else:
            con, view = cursor_of.cursor(), "TEMP TABLE" if load else "TEMP VIEW"
        # One job's files were all written by one ingest, conformed to one schema: read by
        # position. Across jobs (stores of several versions) columns are matched by name,
        # which reads every file's footer at each bind: ~1 ms per file and query.
        by_name = "true" if len({r.job_id for r in refs}) > 1 else "false"
        wanted = TABLES if tables is None else tuple(t for t in TABLES if t in tables)
        present = _table_files(refs, wanted)
        sources = {r.meta.get("source") for r in refs}
        loaded = set(TABLES if load is True else load or ())  # with cursor_of: tables, not views
        for table in wanted:
            files = present[table] if may_hold(sources, table) else []  # else: empty, not read
            if files:
                listing = ", ".join(_sql_str(f) for f in files)
                kind = view if cursor_of is None or table in loaded else "TEMP VIEW"
                con.execute(
                    f"CREATE {kind} {table} AS SELECT * FROM read_parquet([{listing}], union_by_name = {by_name})"
                )
            else:  # a view over no rows (a cursor's: no temporary table to fill, ~4x cheaper)
                kind = view if cursor_of is None else "TEMP VIEW"
                con.execute(
                    f"CREATE {kind} {table} AS SELECT * FROM {EMPTY_SELECTS[table]} WHERE false"
                )
        if cursor_of is None:  # a table of the database, which its cursors' catalogs filter
            create_catalog(con, [r.meta for r in refs], temp=False)
        else:
            keys = ", ".join(_sql_str(f"{r.job_id}/{r.trace_id}") for r in refs)
            con.execute(  # the rows create_catalog would write, in refs order (~0.5 ms, not ~4)
                f"CREATE TEMP VIEW catalog AS SELECT * FROM {_DATABASE}.main.catalog "
                f"WHERE job_id || '/' || trace_id IN ({keys or 'NULL'})"
            )
        return con


def connection_threads() -> int:
    """DuckDB threads of a store connection: 4 at most, within the ingest's thread budget
    when one is set (a Dask worker's threads, ``$STALLSCOPE_THREADS``): an ingest worker
    reads its rank's files back to write the rank card, and W workers on one host each
    with 4 threads would put 4x too many threads on its cores."""
    from stallscope.ingest.startup import thread_budget

    return max(1, min(4, thread_budget() or os.cpu_count() or 1))


def _table_files(refs: list[TraceRef], tables: tuple[str, ...]) -> dict[str, list[str]]:
    """Per table of ``tables``, the paths of its files among ``refs`` (in ``refs`` order): one
    directory listing per trace, not a ``stat`` per trace and table (~10 k at 1,024 ranks)."""
    wanted = {f"{table}.parquet": table for table in tables}
    out: dict[str, list[str]] = {table: [] for table in tables}
    for ref in refs:
        prefix = os.path.join(str(ref.path), "")
        try:
            with os.scandir(ref.path) as entries:
                here = [e.name for e in entries if e.name in wanted and e.is_file()]
        except OSError:
            continue
        for name in here:
            out[wanted[name]].append(prefix + name)
    return out


_KNOWN_FORMATS = frozenset(f for t in _TABLE_DEFS for f in t.formats)


def may_hold(sources: set[str | None], table: str) -> bool:
    """Whether traces of these sources (catalog ``source``: their formats) may hold rows of
    canonical ``table``: a format the table's declaration lists (``schema.Table.formats``),
    or one no table lists (unknown here: it may hold anything). False only when every
    source is a known format whose traces never fill ``table`` (e.g. ``kernel_metrics``
    for Kineto timelines: only Nsight Compute results hold its rows)."""
    formats = BY_NAME[table].formats
    return any(s in formats or s not in _KNOWN_FORMATS for s in sources)


# Python types that go into each catalog column unchanged (create_catalog's one-statement insert)
_CATALOG_PY_TYPES = {"VARCHAR": (str,), "INTEGER": (int,), "BIGINT": (int,), "DOUBLE": (int, float),
                     "BOOLEAN": (bool,)}  # fmt: skip
_CATALOG_ARROW_TYPES = {"VARCHAR": "string", "INTEGER": "int32", "BIGINT": "int64",
                        "DOUBLE": "float64", "BOOLEAN": "bool_"}  # fmt: skip


# The name DuckDB gives the database of ``duckdb.connect()`` (in memory): a cursor's
# temporary ``catalog`` view names the database's own table through it.
_DATABASE = "memory"


def create_catalog(
    con: duckdb.DuckDBPyConnection, metas: list[dict[str, Any]], *, temp: bool = True
) -> None:
    """A ``catalog`` table with one row per trace catalog row (``meta.json``): the scalar fields
    declared in :data:`stallscope.schema.CATALOG` (:data:`CATALOG_COLUMNS`), in that order.
    ``temp``: a temporary table (this connection's only); else a table of the database (seen
    by its cursors too).

    The rows go in as one Arrow table (1,024 rows: a few ms, against ~0.3 s as statement
    parameters) when every value has its column's Python type (``int`` for an integer
    column, and so on); else (a ``meta.json`` written by hand) as parameters, which DuckDB
    casts."""
    cols = ", ".join(f"{name} {typ}" for name, typ in CATALOG_COLUMNS)
    con.execute(f"CREATE {'TEMP ' if temp else ''}TABLE catalog ({cols})")
    import pyarrow as pa

    columns = {}
    for name, typ in CATALOG_COLUMNS:
        values = [meta.get(name) for meta in metas]
        fits = _CATALOG_PY_TYPES[typ]
        if not all(v is None or (type(v) in fits) for v in values):
            _insert_catalog_rows(con, metas)
            return
        columns[name] = values
    try:
        table = pa.table(
            {
                name: pa.array(columns[name], getattr(pa, _CATALOG_ARROW_TYPES[typ])())
                for name, typ in CATALOG_COLUMNS
            }
        )
    except (pa.ArrowException, OverflowError):  # an integer too large for its column
        _insert_catalog_rows(con, metas)
        return
    con.register("_catalog_rows", table)
    try:
        con.execute("INSERT INTO catalog SELECT * FROM _catalog_rows")
    finally:
        con.unregister("_catalog_rows")


def _insert_catalog_rows(con: duckdb.DuckDBPyConnection, metas: list[dict[str, Any]]) -> None:
    rows = [[meta.get(name) for name, _ in CATALOG_COLUMNS] for meta in metas]
    marks = "(" + ", ".join("?" for _ in CATALOG_COLUMNS) + ")"
    for at in range(0, len(rows), 500):  # a statement per 500 rows, not one per row (executemany)
        chunk = rows[at : at + 500]
        con.execute(
            f"INSERT INTO catalog VALUES {', '.join(marks for _ in chunk)}",
            [value for row in chunk for value in row],
        )


UPLOADS = "uploads"


def current_user() -> str:
    """The uploader's name: ``$STALLSCOPE_USER``, else the login name, else ``unknown``."""
    import getpass

    env = os.environ.get("STALLSCOPE_USER")
    if env:
        return env
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 (no passwd entry in some containers)
        return "unknown"


def _now() -> str:
    """Now, ISO 8601 UTC to the microsecond (upload entries, edits: their order matters)."""
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="microseconds")


def _when(text: Any):
    """An ISO time as a comparable datetime (the earliest possible when missing or bad)."""
    from datetime import UTC, datetime

    try:
        value = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return datetime.min.replace(tzinfo=UTC)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _seconds(text: str) -> str:
    """An ISO time to the second, as ``job.json`` shows it."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).isoformat(timespec="seconds")
    except (TypeError, ValueError):
        return ""


def new_upload(
    uploaded_by: str, name: str, tags: list[str] | None, notes: str, uploaded_at: str
) -> dict[str, Any]:
    """One upload entry: who uploaded, when (ISO 8601 UTC), under which name, tags and notes.

    Its id sorts by time: ``<compact time>-<random>``.
    """
    stamp = "".join(c for c in uploaded_at if c.isdigit())[:14]
    return {
        "upload_id": f"{stamp}-{uuid.uuid4().hex[:10]}",
        "uploaded_by": uploaded_by,
        "uploaded_at": uploaded_at,
        "name": name,
        "tags": sorted({t.strip() for t in tags or [] if t.strip()}),
        "notes": notes,
    }


def write_upload(folder: Path, entry: dict[str, Any]) -> None:
    """Write an upload entry into a staging folder (not yet visible)."""
    (folder / UPLOADS).mkdir(exist_ok=True)
    write_json(folder / UPLOADS / f"{entry['upload_id']}.json", entry)


def _legacy_upload(job: dict[str, Any]) -> dict[str, Any]:
    """An older store's job (no ``uploads/``): its ``job.json`` is its one upload."""
    return {
        "upload_id": "job",
        "uploaded_by": job.get("uploaded_by"),
        "uploaded_at": job.get("uploaded_at", ""),
        "name": job.get("name"),
        "tags": list(job.get("tags", [])),
        "notes": job.get("notes", ""),
    }


def _upload_files(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The readable upload entries in ``folder``, oldest first (temporary files ignored)."""
    try:
        paths = sorted(p for p in folder.iterdir() if p.suffix == ".json" and p.name[0] != ".")
    except OSError:
        return []
    out = []
    for path in paths:
        entry = _read_json(path)
        if entry is not None:
            out.append((path, entry))
    out.sort(key=lambda pe: (_when(pe[1].get("uploaded_at")), pe[0].name))
    return out


def _uploads_of(folder: Path, job: dict[str, Any]) -> list[dict[str, Any]]:
    if not (folder / UPLOADS).is_dir():
        return [_legacy_upload(job)]
    return [entry for _, entry in _upload_files(folder / UPLOADS)]


def _materialize_uploads(folder: Path) -> None:
    """Give an older store's job its ``uploads/`` folder (its ``job.json`` as the one upload).

    Built aside and renamed into place: of two writers doing it at once, one
    rename wins and the other's copy is dropped. FileNotFoundError when the
    job is gone.
    """
    if (folder / UPLOADS).is_dir():
        return
    job = _read_json(folder / "job.json")
    if job is None:
        raise FileNotFoundError(folder / "job.json")
    aside = folder / f".{UPLOADS}-{uuid.uuid4().hex[:8]}"
    aside.mkdir()
    try:
        _atomic_write_text(aside / "job.json", json.dumps(_legacy_upload(job)))
        os.rename(aside, folder / UPLOADS)
    except OSError:
        shutil.rmtree(aside, ignore_errors=True)
        if not (folder / UPLOADS).is_dir():
            raise


def _write_verified(path: Path, entry: dict[str, Any]) -> None:
    """Write an upload entry at ``path`` (temporary file, fsync, rename), then read it back
    through ``path``: FileNotFoundError unless the folder then at that path holds it.

    Read back, the entry was in the published job at that moment, so a remover that
    takes the job away later finds it in its trash copy (:meth:`Store.remove_upload`).
    The rename alone proves nothing: a call whose folder was looked up before the job
    was renamed into ``trash/`` completes in that folder, wherever it has moved.
    """
    _atomic_write_text(path, json.dumps(entry))
    if _read_json(path) != json.loads(json.dumps(entry)):
        raise FileNotFoundError(path)


TRASH_GRACE_S = 5.0


def _delete_trash_copy(doomed: Path, grace_s: float = TRASH_GRACE_S) -> None:
    """Delete a folder this process renamed into ``trash/`` and owns, until it is gone.

    An entry may appear in it after the rename, even after ``rmtree`` listed
    its folder (which then cannot be removed: ENOTEMPTY): another process that
    looked up ``jobs/<job_id>/...`` just before the rename may complete its
    call there afterwards, since the kernel resolves a path, then locks its
    last folder, wherever it has moved. Such calls are creations of temporary
    files (an upload entry's, a lease's), the aside folder of an older job's
    uploads, or an upload entry's rename; their makers never use them again
    (their next step fails, or :func:`_write_verified` finds the entry
    missing and writes it again), so deleting them is safe. Each lands within
    its one call, so retrying for ``grace_s`` seconds catches it; what still
    stands after that is removed by :meth:`Store.clean_stale` once this
    process is gone (its pid is in the folder's name).
    """
    deadline = time.monotonic() + grace_s
    while True:
        shutil.rmtree(doomed, ignore_errors=True)
        if not os.path.lexists(doomed) or time.monotonic() >= deadline:
            return
        time.sleep(0.02)


def _trash_is_stale(folder: Path) -> bool:
    """Whether a ``trash/`` folder's owner is gone.

    Its owner is the process that renamed it there, named by the folder's
    name (``<pid>-<host key>-...``, :meth:`Store._take_away`): on this host
    and PID namespace it is stale exactly when that pid is not running. The
    ``.lease`` inside may be another remover's (each writes one before its
    rename, one rename wins), so on this host it is not trusted. A folder of
    another host, or of ``report_store``, is judged by :meth:`Lease.is_stale`.
    """
    pid_text, _, rest = folder.name.partition("-")
    if pid_text.isdigit() and rest.startswith(host_key() + "-"):
        return not pid_alive(int(pid_text))
    return Lease.is_stale(folder)


def _job_row(folder: Path, job: dict[str, Any]) -> dict[str, Any]:
    """A job's catalog row: ``job.json``, its uploads, then its annotations.

    ``name``, ``uploaded_by`` and ``uploaded_at`` are the first remaining
    upload's; ``uploaders`` lists every uploader (first upload first);
    ``tags`` is the union of the uploads' tags (after an edit of the tags:
    the edited tags plus those of later uploads); ``notes`` joins the
    uploads' notes (an edit replaces them); ``uploads`` keeps each entry.
    An edited name (annotations) wins over the first upload's.
    """
    uploads = _uploads_of(folder, job)
    annotations = _read_json(folder / "annotations.json") or {}
    row = dict(job)
    if uploads:
        first = uploads[0]
        row["name"] = first.get("name") or job.get("name")
        row["uploaded_by"] = first.get("uploaded_by")
        row["uploaded_at"] = _seconds(first.get("uploaded_at", "")) or job.get("uploaded_at", "")
    row["uploaders"] = list(dict.fromkeys(u.get("uploaded_by") or "?" for u in uploads))
    row["uploads"] = uploads
    # An edit of the tags replaces those of the uploads before it (an older store's edit,
    # without its time, those of the job.json upload).
    since = _when(
        annotations.get("tags_at") or ("" if "tags" not in annotations else job.get("uploaded_at"))
    )
    tags = set(annotations.get("tags", []))
    tags |= {t for u in uploads if _when(u.get("uploaded_at")) > since for t in u.get("tags", [])}
    row["tags"] = sorted(tags)
    notes = [u.get("notes", "") for u in uploads if u.get("notes", "").strip()]
    row["notes"] = "\n\n".join(dict.fromkeys(notes))
    for key in ("name", "notes"):
        if key in annotations:
            row[key] = annotations[key]
    return row


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _children(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:
        return []


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _atomic_write_text(path: Path, text: str, *, sync: bool = True) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if sync:
        _fsync_dir(path.parent)


HEARTBEAT_S = 15.0
LEASE_NAME = ".lease"


def stale_after_s() -> float:
    """A lease not refreshed for this long is abandoned (``$STALLSCOPE_STAGING_STALE_S``, default 600)."""
    try:
        value = float(os.environ.get("STALLSCOPE_STAGING_STALE_S", "") or 600)
    except ValueError:
        return 600.0
    return value if value > 0 else 600.0


def host_id() -> str:
    """This machine and PID namespace: where a pid means the same process.

    Hostname, kernel boot id and the PID namespace's inode: two containers on
    one host differ (their PID namespaces do), two NFS clients differ (their
    hostnames and boot ids do).
    """
    import socket

    parts = [socket.gethostname()]
    for source in ("/proc/sys/kernel/random/boot_id",):
        try:
            parts.append(Path(source).read_text().strip())
        except OSError:
            parts.append("?")
    try:
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        parts.append("?")
    return "|".join(parts)


def host_key() -> str:
    """A short hash of :func:`host_id`, for folder names."""
    import hashlib

    return hashlib.blake2b(host_id().encode(), digest_size=4).hexdigest()


class Lease:
    """Ownership of one staging folder: ``.lease`` holds host id, pid and a heartbeat.

    The owner refreshes the heartbeat every :data:`HEARTBEAT_S` from a daemon
    thread while it ingests. Written atomically (``os.replace``), so a reader
    never sees half a lease.
    """

    _beating: dict[str, threading.Event] = {}

    @classmethod
    def start_heartbeat(cls, folder: Path) -> None:
        stop = threading.Event()
        cls._beating[str(folder)] = stop
        threading.Thread(
            target=cls._beat, args=(folder, stop), name="stallscope-lease", daemon=True
        ).start()

    @classmethod
    def release(cls, folder: Path) -> None:
        stop = cls._beating.pop(str(folder), None)
        if stop is not None:
            stop.set()
        with contextlib.suppress(OSError):
            (folder / LEASE_NAME).unlink()

    @classmethod
    def _beat(cls, folder: Path, stop: threading.Event) -> None:
        while not stop.wait(HEARTBEAT_S):
            if os.getpid() != cls._owner_pid(folder):
                return  # a forked child (decode workers) never refreshes its parent's lease
            with contextlib.suppress(OSError):
                cls.write(folder)

    @staticmethod
    def _owner_pid(folder: Path) -> int | None:
        lease = _read_json(folder / LEASE_NAME) or {}
        return lease.get("pid")

    @staticmethod
    def write(folder: Path) -> None:
        body = {"host": host_id(), "pid": os.getpid(), "heartbeat": time.time()}
        _atomic_write_text(folder / LEASE_NAME, json.dumps(body), sync=False)

    @staticmethod
    def is_stale(folder: Path) -> bool:
        """True when the folder's owner is surely gone: a stale heartbeat, or a dead local pid.

        Without a readable lease (a writer between ``mkdir`` and its first
        lease write), the folder's name gives the host key and pid; a folder
        of another host, or of an older version, is judged by its own age.
        """
        limit = stale_after_s()
        lease = _read_json(folder / LEASE_NAME)
        now = time.time()
        if lease is None:  # judged by its name: <pid>-<host key>-<random>
            pid_text, _, rest = folder.name.partition("-")
            if rest.startswith(host_key() + "-") and pid_text.isdigit():
                return not pid_alive(int(pid_text))
            try:
                return now - folder.stat().st_mtime > limit
            except OSError:
                return False
        pid = lease.get("pid")
        if lease.get("host") == host_id() and isinstance(pid, int) and not pid_alive(pid):
            return True
        beat = lease.get("heartbeat")
        try:
            seen = (folder / LEASE_NAME).stat().st_mtime
        except OSError:
            seen = 0.0
        newest = max(beat if isinstance(beat, (int, float)) else 0.0, seen)
        return now - newest > limit


def sync_tree(folder: Path, durable: Collection[Path] = ()) -> None:
    """fsync every file and folder below ``folder`` (and itself): durable before it is published.

    Files in ``durable`` (already fsync'ed by their writer, unchanged since) are skipped.
    Files, then folders, are synced by a few threads at once (``fsync`` waits on the disk
    without the GIL: a job of 1,000 ranks has ~15,000 files and ~1,000 folders); the order
    of the fsyncs does not matter, only that all are done before the publishing rename.
    """
    paths = list(folder.rglob("*"))
    skip = set(durable)
    files = [path for path in paths if path not in skip and path.is_file()]
    folders = [path for path in paths if path.is_dir()] + [folder]
    if len(files) + len(folders) > 8:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(_fsync_file, files))
            list(pool.map(_fsync_dir, folders))
    else:
        for path in files:
            _fsync_file(path)
        for path in folders:
            _fsync_dir(path)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a directory
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether a local process ``pid`` still runs. A zombie (exited, not yet reaped: the
    orphaned ingest worker of a killed CLI waits for an init that may never reap it) is
    dead: it holds nothing and will write nothing."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """Linux: the state field of ``/proc/<pid>/stat`` is Z (zombie) or X (dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[:1]  # the name in parentheses may hold spaces
    return state in (["Z"], ["X"])


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Write a catalog file inside a staging folder (not yet visible)."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(value, fh, indent=1, sort_keys=True)
