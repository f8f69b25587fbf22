"""Which rank each trace of an Nsight Systems export is (docs/formats/nsys.md, "Ranks").

An export becomes one trace per process with GPU activity, and within a
process that drove several GPUs, one trace per GPU (a *unit*). Ranks come from,
in order:

1. ``MPI_RANKS`` (``globalTid -> rank``), then NVTX thread names ``MPI Rank N``
   (what nsys's MPI tracing writes in older exports), then the ``Rank`` field of
   the NCCL domain's ``ncclCommInitRank*`` payload (the communicator with the
   most ranks wins) — used when every unit is a single-GPU process with its
   own, distinct rank;
2. else, when every process drove exactly one GPU and no two the same one,
   the GPU's position among the GPUs used (``cuda:r`` is rank ``r``: the
   ``torchrun`` convention);
3. else the position of the unit ordered by (process id, GPU).

A file with a single unit and no recorded rank takes a rank from its file name
(``rank3``, ``rank_3``, ``worker3``) like a Kineto file, else 0 when it is the
job's only file, else none (the job then refuses to guess).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from stallscope.ingest.formats import rank_in_name

_MPI_THREAD = re.compile(r"^MPI Rank (\d+)$")
# The file-name rule of Kineto files (ingest/kineto/parse.py).


@dataclass
class Unit:
    """One trace to be: a process (``gp`` key, OS ``pid``) and, when split, one GPU."""

    gp: int
    pid: int
    device: int
    split: bool
    rank: int | None = None

    @property
    def key(self) -> str:
        return f"pid{self.pid}-gpu{self.device}" if self.split else f"pid{self.pid}"

    @property
    def label(self) -> str:
        return f"pid {self.pid}, GPU {self.device}"


def recorded_ranks(
    mpi: dict[int, int], thread_names: list[tuple[int, str]], nccl: list[tuple[int, str]]
) -> tuple[dict[int, int], str | None, int | None]:
    """(process key -> rank, where the ranks came from, world size when recorded)."""
    if mpi:
        return mpi, "MPI_RANKS", None
    named: dict[int, int] = {}
    for gp, text in thread_names:
        match = _MPI_THREAD.match(text or "")
        if match:
            named.setdefault(gp, int(match.group(1)))
    if named:
        return named, "NVTX thread name 'MPI Rank N'", None
    best: dict[int, tuple[int, int]] = {}  # gp -> (ranks in communicator, rank)
    for gp, payload in nccl:
        fields = payload_fields(payload)
        rank, size = fields.get("rank"), fields.get("no. of ranks")
        if isinstance(rank, int) and rank >= 0 and (gp not in best or (size or 0) > best[gp][0]):
            best[gp] = (size if isinstance(size, int) else 0, rank)
    if best:
        world = max(size for size, _ in best.values()) or None
        return {gp: rank for gp, (_, rank) in best.items()}, "NCCL NVTX payload", world
    return {}, None, None


def assign(units: list[Unit], recorded: dict[int, int], name: str, single: bool) -> str:
    """Set ``unit.rank`` on every unit; returns how the ranks were chosen."""
    if len(units) == 1:
        unit = units[0]
        if unit.gp in recorded:
            unit.rank = recorded[unit.gp]
            return "recorded"
        named = rank_in_name(name)
        unit.rank = named if named is not None else (0 if single else None)
        return "file name" if named is not None else "single process"
    ranks = [recorded.get(u.gp) for u in units]
    if all(r is not None for r in ranks) and not any(u.split for u in units) and _distinct(ranks):
        for unit, rank in zip(units, ranks, strict=True):
            unit.rank = rank
        return "recorded"
    devices = [u.device for u in units]
    if not any(u.split for u in units) and _distinct(devices):
        order = sorted(devices)
        for unit in units:
            unit.rank = order.index(unit.device)
        return "GPU index"
    for index, unit in enumerate(sorted(units, key=lambda u: (u.pid, u.device))):
        unit.rank = index
    return "process order"


def _distinct(values: list) -> bool:
    return len(set(values)) == len(values)


def payload_fields(payload: str) -> dict:
    """Lower-cased field names of an NVTX JSON payload (one level of nesting flattened)."""
    try:
        doc = json.loads(payload)
    except (ValueError, TypeError):
        return {}
    out: dict = {}
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if isinstance(value, dict | list):
                    stack.append(value)
                else:
                    out.setdefault(str(key).strip().lower(), value)
        elif isinstance(item, list):
            stack.extend(item)
    return out
