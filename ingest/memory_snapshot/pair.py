"""Give each memory snapshot of a job its rank: the rank of the timeline trace it belongs to.

Called by the job ingester once every file of the job is parsed (as Nsight
Compute results are paired, :mod:`stallscope.ingest.ncu.match`). A snapshot
records no rank, so:

1. **No timeline in the job** (snapshots only): a lone snapshot is rank 0, as
   it always was; several take the rank their file names give (``rank1``,
   ``worker_1``...), else they are refused.
2. **With timelines** (Kineto, Nsight Systems): the rank its file name gives,
   which must be one of the timelines' ranks; else the only rank of the job;
   else the one rank whose timeline ran on every device the snapshot recorded
   (one process per GPU); else refused: name the rank in the file name.

A refusal is an :class:`~stallscope.errors.InputError` naming the ranks and
the fix: nothing of the job is written. The snapshot's trace then sits beside
its timeline's trace under the same rank; the ``memory`` analyzer reads the two
together (docs/analyzers/memory.md#paired).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from stallscope.errors import InputError
from stallscope.ingest.formats import (
    SEPARATE_JOBS_HINT,
    rank_in_name,
    ranks_on_devices,
)

SOURCE = "memory-snapshot"
NAMING = "put the rank in its file name, e.g. rank1.snapshot.pickle"


def pair_snapshots(metas: list[dict[str, Any]], staging: Path) -> None:
    """Set the ``rank`` of every snapshot trace in ``metas`` (see the module docstring)."""
    snapshots = [m for m in metas if m["source"] == SOURCE]
    timelines = [m for m in metas if m["source"] != SOURCE]  # the job gives only its own and those
    for meta in snapshots:
        if not timelines:
            meta["rank"] = 0 if len(snapshots) == 1 else _named_rank(meta)
        else:
            meta["rank"] = _timeline_rank(meta, staging / meta["trace_id"], timelines)


def _named_rank(meta: dict[str, Any]) -> int:
    rank = rank_in_name(meta["file_name"])
    if rank is None:
        raise InputError(
            meta["file_name"],
            "cannot tell this file's rank: a memory snapshot records none, and its file name"
            f" gives none ({SEPARATE_JOBS_HINT})",
        )
    return rank


def _timeline_rank(meta: dict[str, Any], folder: Path, timelines: list[dict[str, Any]]) -> int:
    ranks = sorted({m["rank"] for m in timelines})
    named = rank_in_name(meta["file_name"])
    if named is not None:
        if named not in ranks:
            raise InputError(
                meta["file_name"],
                f"the file name says rank {named}, but the job's traces are of ranks "
                f"{', '.join(map(str, ranks))}: a memory snapshot pairs with the trace of its rank",
            )
        return named
    if len(ranks) == 1:
        return ranks[0]
    devices = set(
        pq.read_table(folder / "memory.parquet", columns=["device"])["device"].to_pylist()
    )
    owners = ranks_on_devices(timelines, devices)
    if len(owners) == 1:
        return owners[0]
    raise InputError(
        meta["file_name"],
        f"cannot tell which rank this memory snapshot belongs to (the job has ranks "
        f"{', '.join(map(str, ranks))}, and its GPUs do not tell): {NAMING}",
    )
