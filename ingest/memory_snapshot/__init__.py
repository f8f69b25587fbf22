"""PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot()`` pickles).

``parse.py`` unpickles one with every global refused and writes its allocator
events into the ``memory`` table (docs/schema.md, docs/security.md). A snapshot
is a companion: given with a timeline trace (Kineto, Nsight Systems) it is the
memory side of that trace's rank (``pair.py`` finds which), not a rank of its
own; alone it is its own job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stallscope.ingest.formats import Format, ParseContext, ParsedTrace, Payload
from stallscope.ingest.reader import Source


def looks_like_snapshot(name: str, head: bytes) -> bool:
    """A pickle (protocol 2 to 5): a snapshot, or refused by the parser, which builds only plain values."""
    return head[:1] == b"\x80" and head[1:2] in b"\x02\x03\x04\x05"


def _parse(source: Source, payload: Payload, ctx: ParseContext) -> list[ParsedTrace]:
    from stallscope.ingest.memory_snapshot.parse import parse_snapshot

    return parse_snapshot(source, payload.take(), ctx)


def _pair(metas: list[dict[str, Any]], staging: Path) -> None:
    from stallscope.ingest.memory_snapshot.pair import pair_snapshots

    pair_snapshots(metas, staging)


FORMAT = Format(
    name="memory-snapshot",
    title="PyTorch CUDA memory snapshot",
    detect=looks_like_snapshot,
    parse=_parse,
    provides=frozenset(),
    priority=40,
    binary=True,
    companion=True,
    finish=_pair,
    extensions=("pickle", "pkl"),
)
