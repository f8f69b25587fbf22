"""Ingest and analysis on a Dask cluster (``--scheduler ADDRESS`` / ``$STALLSCOPE_SCHEDULER``).

``dask.distributed`` is an optional extra (``pip install 'stallscope[dask]'``):
this module imports it only when a scheduler is asked for; :func:`connect`
turns its absence, or a scheduler it cannot reach, into one
:class:`~stallscope.errors.EnvironmentProblem` (exit 4).

Ingest (:class:`DaskRanks`): the client (the ``stallscope`` command) plans
the job and owns its staging folder, as for an ingest on one machine; each
file is hashed, then parsed, by a task on a worker, which writes the file's
traces into a staging folder of its own (a lease of its own: a worker killed
mid-file leaves a folder the store's lease rules remove) and renames each
complete trace folder into the job's staging folder. When every file is in,
the client writes the catalog files and publishes the job with the one
rename of an ingest on one machine: a reader sees all ranks or none. So the
store, and the files given, must be on a filesystem that the client and every
worker see at the same paths (the client checks it, and says so when not).

Failures: a task that raises is run again (``retries``, default 2), and one
whose worker dies is given to another worker (the scheduler's
``distributed.scheduler.allowed-failures``, default 3). Bad input
(an :class:`~stallscope.errors.InputError`: it would fail the same way again)
is not retried: the first one ends the ingest with its one line, exit 3, the
other tasks cancelled and the store unchanged. A file whose workers keep dying
ends it with exit 4.

Analysis (:class:`DaskExecutor`): :mod:`stallscope.fanout` submits the
per-rank analyzers of each run of consecutive ranks as one task (at most two
tasks per worker thread and job); the cross-rank analyzers run in this
process meanwhile.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stallscope.errors import EnvironmentProblem, InputError, StallscopeError
from stallscope.store import Store, sync_tree

if TYPE_CHECKING:  # the ingest modules are imported by the tasks that use them
    from stallscope.ingest.job import Progress
    from stallscope.ingest.reader import Source

ENV = "STALLSCOPE_SCHEDULER"
CONNECT_TIMEOUT_S = 10.0
RETRIES = 2  # a task that raises runs at most 1 + RETRIES times
INSTALL_HINT = "pip install 'stallscope[dask]'"
_POLL_S = 0.05


def scheduler_address(option: str | None) -> str | None:
    """The scheduler to use: ``--scheduler``, else ``$STALLSCOPE_SCHEDULER``, else None (local)."""
    address = (option or os.environ.get(ENV) or "").strip()
    return address or None


def connect(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> Any:
    """A ``distributed.Client`` of the scheduler at ``address`` with at least one worker.

    Raises EnvironmentProblem (one line) when dask.distributed is not
    installed, the address is malformed, nothing answers there within
    ``timeout_s``, or no worker joins it within ``timeout_s``.
    """
    try:
        from distributed import Client
    except ImportError:
        raise EnvironmentProblem(
            f"--scheduler needs dask.distributed, which is not installed: {INSTALL_HINT}"
        ) from None
    _probe(address, timeout_s)
    hook = sys.unraisablehook
    sys.unraisablehook = lambda *_: None  # a Client that failed to start complains as it goes
    try:
        client = Client(address, timeout=timeout_s, set_as_default=False)
    except (OSError, ValueError, TimeoutError) as exc:
        raise EnvironmentProblem(
            f"cannot reach the Dask scheduler at {address} ({_first_line(exc)})"
        ) from None
    finally:
        import gc

        gc.collect()
        sys.unraisablehook = hook
    try:
        client.wait_for_workers(1, timeout=timeout_s)
    except (TimeoutError, OSError):
        client.close()
        raise EnvironmentProblem(
            f"the Dask scheduler at {address} has no workers (none joined within {timeout_s:g} s)"
        ) from None
    return client


def _probe(address: str, timeout_s: float) -> None:
    """Fail fast, with one line, when nothing listens at a ``tcp://host:port`` address."""
    rest = address.split("://", 1)[-1] if "://" in address else address
    if not address.startswith(("tcp://", "tls://")) and "://" in address:
        return  # inproc://, ucx://...: left to distributed
    host, _, port = rest.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise EnvironmentProblem(f"--scheduler {address}: not an address like tcp://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=min(timeout_s, 5.0)).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise EnvironmentProblem(
            f"cannot reach the Dask scheduler at {address} ({reason}): is it running?"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- analysis ------------------------------------------------------------------


class DaskExecutor:
    """``submit(fn, *args)`` on a Dask cluster: the executor :mod:`stallscope.fanout` takes.

    Each call is a task of its own (never deduplicated), run again up to
    ``retries`` times when it raises. ``cross_here``: the cross-rank analyzers
    run on the client.
    """

    cross_here = True

    def __init__(self, client: Any, retries: int = RETRIES):
        self.client = client
        self.retries = retries

    @property
    def slots(self) -> int:
        """Tasks the cluster runs at once: its workers' threads."""
        workers = self.client.scheduler_info().get("workers", {})
        return max(1, sum(w.get("nthreads", 1) for w in workers.values()))

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.client.submit(fn, *args, pure=False, retries=self.retries)

    def result(self, future: Any, what: str) -> Any:
        """A task's result; its worker dying too often becomes an EnvironmentProblem."""
        return task_result(future, what)


@contextmanager
def _cluster_errors(what: str) -> Iterator[None]:
    """A lost worker or scheduler inside the block said in one line (EnvironmentProblem, exit
    4); stallscope's own errors pass through."""
    from distributed import KilledWorker

    try:
        yield
    except KilledWorker:
        raise EnvironmentProblem(
            f"{what}: the Dask workers running it died (killed or out of memory) too many times"
        ) from None
    except StallscopeError:
        raise
    except (OSError, TimeoutError) as exc:
        raise EnvironmentProblem(f"{what}: lost the Dask cluster ({_first_line(exc)})") from None


def task_result(future: Any, what: str) -> Any:
    """``future.result()``, with a lost worker or scheduler said in one line (exit 4)."""
    with _cluster_errors(what):
        return future.result()


# -- ingest --------------------------------------------------------------------


@dataclass(frozen=True)
class RankFile:
    """One input file of a job as a worker opens it: its absolute path on the shared
    filesystem, or (a zip member) its stored bytes, sent along."""

    name: str
    file_bytes: int
    path: str | None = None
    data: bytes | None = None
    member: str | None = None

    @staticmethod
    def of(source: Source) -> RankFile:
        if source.path is not None:
            return RankFile(source.name, source.file_bytes, os.path.abspath(source.path),
                            member=source.member)  # fmt: skip
        return RankFile(source.name, source.file_bytes, data=bytes(source.raw()),
                        member=source.member)  # fmt: skip

    def source(self) -> Source:
        """The file as a :class:`Source` on this worker (InputError when it cannot be read)."""
        from stallscope.ingest.reader import Source, _file_source

        if self.path is None:
            data = self.data or b""
            return Source(self.name, lambda: data, self.file_bytes, member=self.member, _raw=data)
        if not os.path.exists(self.path):
            raise NotShared(
                f"{self.name}: not found at {self.path} on worker {socket.gethostname()}: "
                "the files given must be on a filesystem every Dask worker sees at the same path"
            )
        source = _file_source(Path(self.path), self.name)
        source.member = self.member
        return source


class NotShared(EnvironmentProblem):
    """A path the client sees and a worker does not (no shared filesystem)."""


@dataclass(frozen=True)
class Failed:
    """A task's deterministic failure, returned rather than raised so it is not retried."""

    kind: str  # "input" or "environment"
    message: str

    def error(self) -> StallscopeError:
        if self.kind == "input":
            return _LineError(self.message)
        return EnvironmentProblem(self.message)


class _LineError(InputError):
    """An InputError whose message (``file: reason``) came whole from a worker."""

    def __init__(self, message: str):
        source, _, reason = message.partition(": ")
        super().__init__(source, reason)


def hash_file(item: RankFile) -> str | Failed:
    """A worker task: the SHA-256 of one input file (``Source.file_hash``)."""
    try:
        return item.source().file_hash
    except InputError as exc:
        return Failed("input", str(exc))
    except EnvironmentProblem as exc:
        return Failed("environment", str(exc))


def ingest_rank(store_root: str, staging: str, job_id: str, digest: str, item: RankFile,
                single: bool) -> list[dict[str, Any]] | Failed:  # fmt: skip
    """A worker task: parse one file, and move its complete trace folders into ``staging``.

    The file is parsed into a staging folder of this worker's own (its lease:
    this process), so a worker killed mid-file leaves only that folder, which
    the store's lease rules remove; each trace folder is renamed into the
    job's staging folder whole. A trace folder already there (an earlier
    attempt that finished before its worker died) is kept: it holds the same
    bytes. Returns the traces' catalog rows, or :class:`Failed`.
    """
    target = Path(staging)
    if not target.is_dir():
        return Failed(
            "environment",
            f"worker {socket.gethostname()} does not see the job's staging folder {staging}: the "
            "store must be on a filesystem the client and every Dask worker see at the same path",
        )
    try:
        source = item.source()
    except NotShared as exc:
        return Failed("environment", str(exc))
    except InputError as exc:
        return Failed("input", str(exc))
    from stallscope.ingest.job import ingest_source

    _use_worker_threads()
    store = Store(store_root)
    own = store.new_staging()
    try:
        metas = ingest_source(source, job_id, digest, own, single=single)
        for meta in metas:
            # Durable here, in parallel with the other workers: the client's fsync of the
            # job before it publishes (Store.publish) then finds these files already clean.
            sync_tree(own / meta["trace_id"])
            _move_in(own / meta["trace_id"], target / meta["trace_id"])
    except InputError as exc:
        return Failed("input", str(exc))
    finally:
        store.discard(own)
    return metas


def _use_worker_threads() -> None:
    """Size this task's DuckDB and Arrow threads to its Dask worker's (``--nthreads``).

    Without this, each of W workers on a host would run its ingest's SQL and
    Arrow work on every CPU of the host: W times as many threads as cores.
    """
    import pyarrow as pa

    from stallscope.ingest.startup import set_thread_budget

    try:
        from distributed import get_worker

        threads = int(get_worker().state.nthreads)
    except (ImportError, ValueError, AttributeError, TypeError):
        return  # not on a Dask worker (a test calling the task directly)
    set_thread_budget(threads)
    if pa.cpu_count() != threads:
        pa.set_cpu_count(threads)


def _move_in(folder: Path, target: Path) -> None:
    """Rename a complete trace folder into the job's staging folder (kept if already there)."""
    try:
        os.rename(folder, target)
    except OSError:
        if not target.is_dir():  # (only ever renamed in whole)
            raise
        shutil.rmtree(folder, ignore_errors=True)


class DaskRanks:
    """A :class:`~stallscope.ingest.job.RankIngest` that hashes and parses on Dask workers."""

    def __init__(self, client: Any, store: Store, retries: int = RETRIES):
        self.client = client
        self.store_root = str(store.root.absolute())
        self.retries = retries
        self.synced: frozenset[Path] = frozenset()

    def hashes(self, sources: list[Source]) -> list[str]:
        """Files on the shared filesystem are hashed by workers; zip members here (streamed)."""
        from stallscope.ingest.limits import check_deadline

        on_disk = [i for i, s in enumerate(sources) if s.path is not None]
        # One message for every task (client.map), not one round trip each (client.submit).
        futures = self.client.map(hash_file, [RankFile.of(sources[i]) for i in on_disk],
                                  pure=False, retries=self.retries)  # fmt: skip
        digests = dict(zip(on_disk, self._gather(futures, [sources[i].name for i in on_disk]),
                           strict=True))  # fmt: skip
        for i, source in enumerate(sources):
            if i in digests:
                source._hash = digests[i]
            else:
                check_deadline(source.name)
                digests[i] = source.file_hash
        return [digests[i] for i in range(len(sources))]

    def ingest(
        self,
        sources: list[Source],
        hashes: list[str],
        job_id: str,
        staging: Path,
        *,
        single: bool,
        progress: Progress | None,
    ) -> list[dict[str, Any]]:
        items = []
        for source in sources:
            items.append(RankFile.of(source))  # a zip member: its bytes, sent with the task
            source.release()
        n = len(items)
        futures = self.client.map(
            ingest_rank, [self.store_root] * n, [str(staging.absolute())] * n, [job_id] * n,
            hashes, items, [single] * n, pure=False, retries=self.retries,
        )  # fmt: skip
        per_file = self._gather(futures, [s.name for s in sources], progress, "ingested")
        metas = [meta for metas in per_file for meta in metas]
        # Each trace folder was fsync'ed whole by its worker before it was moved in
        # (ingest_rank): the publish need not sync its files again, only what is added.
        self.synced = frozenset(
            path
            for meta in metas
            for path in (staging / meta["trace_id"]).iterdir()
            if path.is_file()
        )
        return metas

    def _gather(
        self,
        futures: list[Any],
        names: list[str],
        progress: Progress | None = None,
        label: str = "",
    ) -> list[Any]:
        """Every task's result, in order; the first failure cancels the rest and raises."""
        from stallscope.ingest.limits import check_deadline

        index = {f.key: i for i, f in enumerate(futures)}
        results: list[Any] = [None] * len(futures)
        pending = set(futures)
        try:
            while pending:
                check_deadline(names[0])
                finished = [f for f in pending if f.done()]
                if not finished:
                    time.sleep(_POLL_S)
                    continue
                # A task that raised is read alone, which raises its error; the results of
                # the others come in one round trip (not one per task: ~1 ms each on a quiet
                # client, 40 ms on a busy one, for every rank).
                for future in finished:
                    if future.status != "finished":
                        task_result(future, names[index[future.key]])
                values = _results(self.client, finished, names[index[finished[0].key]])
                for future, value in zip(finished, values, strict=True):
                    pending.discard(future)
                    i = index[future.key]
                    if isinstance(value, Failed):
                        raise value.error()
                    results[i] = value
                    if progress and label:
                        progress(f"{label} {names[i]}", len(futures) - len(pending), len(futures))
        finally:
            if pending:
                self.client.cancel(list(pending))
        return results


def _results(client: Any, futures: list[Any], what: str) -> list[Any]:
    """The results of finished futures, fetched together (errors as :func:`task_result`'s)."""
    if not futures:
        return []
    with _cluster_errors(what):
        return list(client.gather(futures))


def close_quietly(client: Any) -> None:
    """Close a client without waiting long on a cluster that went away."""
    with suppress(Exception):
        client.close(timeout=5)
