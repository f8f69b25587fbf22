"""The limits every ingest runs under, and the range every ingested value must be in.

An input that passes ingest must always be analyzable, so values are checked
at the door (:func:`check_trace`) instead of failing later on a shared page:

- ranks are ``0 <= rank < world_size <= MAX_WORLD_SIZE`` (1,000,000);
- a job holds at most :func:`max_ranks` ranks (``$STALLSCOPE_MAX_RANKS``, default 1024);
- every time is an int64 nanosecond within ``±TIME_LIMIT_NS`` (2**62, so sums of
  two never overflow), and one trace's events span at most ``MAX_SPAN_NS`` (31 days).

Wall time: :func:`start_deadline` sets the ingest's deadline (``--timeout``);
:func:`check_deadline` raises once it has passed, and long SQLite queries
are aborted by a progress handler that asks :func:`deadline_passed`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stallscope.errors import InputError

MAX_WORLD_SIZE = 1_000_000
TIME_LIMIT_NS = 2**62
MAX_SPAN_NS = 31 * 86_400 * 10**9
_TIMED_TABLES = ("gpu", "host", "ranges", "collectives")

# Decompression: real traces measured 3-58x (gzip and zip deflate), so output
# past RATIO_CAP x the compressed size plus a headroom is refused as a bomb.
RATIO_CAP = 100
DEFAULT_HEADROOM_MB = 32
DEFAULT_TIMEOUT_S = 1800.0

_deadline: float | None = None
_timeout_s: float | None = None
_memory_limit_mb: int | None = None


def physical_memory_mb() -> int:
    """This machine's RAM in MiB (4096 when it cannot be told)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    except (ValueError, OSError, AttributeError):
        return 4096


def default_timeout_s() -> float:
    """``$STALLSCOPE_INGEST_TIMEOUT`` seconds, else 1800 (30 min)."""
    return env_number("STALLSCOPE_INGEST_TIMEOUT", DEFAULT_TIMEOUT_S)


def default_memory_mb() -> int:
    """``$STALLSCOPE_INGEST_MAX_MEMORY_MB``, else 75% of the RAM (at least 2048)."""
    fallback = max(2048, physical_memory_mb() * 3 // 4)
    return int(env_number("STALLSCOPE_INGEST_MAX_MEMORY_MB", fallback))


def apply_memory_limit(mb: int | None) -> None:
    """Record this ingest's memory budget in MiB: decompression is capped at a third of it.

    The budget itself is enforced by the supervising process
    (:mod:`stallscope.supervise`), which measures the worker's real memory
    (proportional set size, worker and its decode processes together) and
    stops it past the budget. ``RLIMIT_AS`` is not used: it counts address
    space, not memory (an ingest holding 150 MB reserved 2.2 GB of address space
    on a 2-CPU machine, more with more CPUs: Arrow/DuckDB thread pools and
    allocator arenas), so any sane cap refused ordinary traces, and a thread
    that could not start hung the ingest.
    """
    global _memory_limit_mb
    _memory_limit_mb = int(mb) if mb and mb > 0 else None


def memory_limit_text() -> str:
    if _memory_limit_mb:
        return f"the {_memory_limit_mb:,} MiB limit: --max-memory-mb raises it"
    return "the memory of this machine"


def ratio_cap(compressed_bytes: int) -> int:
    """RATIO_CAP x ``compressed_bytes`` plus the headroom (``$STALLSCOPE_DECOMPRESS_HEADROOM_MB``)."""
    headroom = int(env_number("STALLSCOPE_DECOMPRESS_HEADROOM_MB", DEFAULT_HEADROOM_MB)) << 20
    return RATIO_CAP * compressed_bytes + headroom


def decompressed_cap(compressed_bytes: int, ceiling: int) -> int:
    """Most bytes ``compressed_bytes`` may expand to: ratio cap plus headroom, within ``ceiling``.

    ``ceiling`` is the largest trace accepted; under a memory limit it is also
    at most a third of that limit (the parse needs the bytes and their decoding).
    """
    cap = ratio_cap(compressed_bytes)
    if _memory_limit_mb:
        ceiling = min(ceiling, (_memory_limit_mb << 20) // 3)
    return min(cap, ceiling)


def env_number(name: str, default: float) -> float:
    """A positive number from the environment, else ``default`` (0 or negative: ``default``)."""
    try:
        value = float(os.environ.get(name, "") or default)
    except ValueError:
        return default
    return value if value > 0 else default


def max_ranks() -> int:
    """Most ranks (timelines) one job may hold (``$STALLSCOPE_MAX_RANKS``, default 1024)."""
    return int(env_number("STALLSCOPE_MAX_RANKS", 1024))


def start_deadline(timeout_s: float | None) -> None:
    """Start the wall-time budget of this process's ingest (None: no limit)."""
    global _deadline, _timeout_s
    _timeout_s = timeout_s if timeout_s and timeout_s > 0 else None
    _deadline = time.monotonic() + _timeout_s if _timeout_s else None


def deadline_passed() -> bool:
    return _deadline is not None and time.monotonic() > _deadline


def timeout_reason(timeout_s: float | None = None) -> str:
    """Why an ingest past ``timeout_s`` (default: this process's deadline) was stopped."""
    limit = timeout_s if timeout_s is not None else _timeout_s
    return (
        f"ingest took longer than the {limit or 0:g} s limit "
        "(--timeout or $STALLSCOPE_INGEST_TIMEOUT raise it)"
    )


def check_deadline(name: str) -> None:
    """Raise an InputError naming ``name`` once the ingest's deadline has passed."""
    if deadline_passed():
        raise InputError(name, timeout_reason())


def check_rank(name: str, rank: int | None, world_size: int | None) -> None:
    """``0 <= rank < world_size <= MAX_WORLD_SIZE`` (either may be unknown)."""
    if world_size is not None and not 0 < world_size <= MAX_WORLD_SIZE:
        raise InputError(
            name, f"world size {_short(world_size)} is out of range (1 to {MAX_WORLD_SIZE:,})"
        )
    if rank is None:
        return
    if not 0 <= rank < MAX_WORLD_SIZE:
        raise InputError(name, f"rank {_short(rank)} is out of range (0 to {MAX_WORLD_SIZE - 1:,})")
    if world_size is not None and rank >= world_size:
        raise InputError(name, f"rank {rank} is not below the world size {world_size}")


def check_times(name: str, tables: dict[str, Any]) -> None:
    """Every start/end within ±TIME_LIMIT_NS and the whole trace within MAX_SPAN_NS."""
    lows, highs = [], []
    for table_name in _TIMED_TABLES:
        table = tables.get(table_name)
        if table is None or table.num_rows == 0:
            continue
        for column in ("start_ns", "end_ns"):
            if column not in table.column_names:
                continue
            low, high = _min_max(table, column)
            if low is not None:
                lows.append(low)
                highs.append(high)
    if not lows:
        return
    low, high = min(lows), max(highs)
    if low < -TIME_LIMIT_NS or high > TIME_LIMIT_NS:
        raise InputError(name, f"timestamps out of range ({low:,} to {high:,} ns)")
    if high - low > MAX_SPAN_NS:
        raise InputError(
            name,
            f"events span {(high - low) / 86_400e9:,.0f} days (from {low:,} to {high:,} ns), "
            f"more than the {MAX_SPAN_NS // 86_400_000_000_000} days a trace can cover: "
            "timestamps out of range",
        )


def _min_max(table: Any, column: str) -> tuple[int | None, int | None]:
    """(min, max) of ``column``: computed for an Arrow table, recorded for a streamed one."""
    if isinstance(table, pa.Table):
        bounds = pc.min_max(table[column])
        return bounds["min"].as_py(), bounds["max"].as_py()
    return table.bounds.get(column, (None, None))  # ingest.streamed.WrittenTable


def negative_durations(table: Any) -> int:
    """Rows whose end is before their start (a streamed table counted them as it was written)."""
    if not isinstance(table, pa.Table):
        return table.negative_durations  # ingest.streamed.WrittenTable: already repaired
    if table.num_rows == 0 or "end_ns" not in table.column_names:
        return 0
    return int(pc.sum(pc.less(table["end_ns"], table["start_ns"])).as_py() or 0)


def _short(value: int) -> str:
    text = f"{value:,}"
    return text if len(text) <= 20 else f"{value:.3g}"
