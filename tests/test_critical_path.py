"""The what-if replay and critical path on hand-built op tables whose answers are known.

Times in ms (``MS`` = 1 ms in ns).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stallscope.critical_path import (
    Compression,
    compress_times,
    critical_path,
    dependencies,
    path_index,
    replay,
    saving,
)

MS = 1_000_000


def op(part, stream, start, end, launch=-1, inst=-1, transfer=0, step=0, name="k"):
    return {
        "part": part, "rank": part, "stream": stream, "start_ns": start * MS, "end_ns": end * MS,
        "launch_ns": launch * MS if launch >= 0 else -1, "inst": inst, "transfer_ns": transfer * MS,
        "step": step, "is_comm": inst >= 0, "name": name,
    }  # fmt: skip


def two_ranks() -> pd.DataFrame:
    """Rank 0: gemm [0,10), all-reduce [10,45) (waits 30), then B [45,55) after it.

    Rank 1's host is late: gemm launched at 30 runs [30,40), its all-reduce [40,45),
    B [45,55). Transfer 5 ms on both. B waits for the all-reduce (an event wait).
    """
    return pd.DataFrame(
        [
            op(0, 7, 0, 10, launch=0, name="gemm"),
            op(0, 20, 10, 45, launch=0, inst=0, transfer=5, name="allreduce"),
            op(0, 7, 45, 55, launch=1, name="B"),
            op(1, 7, 30, 40, launch=30, name="gemm"),
            op(1, 20, 40, 45, launch=30, inst=0, transfer=5, name="allreduce"),
            op(1, 7, 45, 55, launch=31, name="B"),
        ]
    )


NO_SYNCS = pd.DataFrame({"part": [], "start_ns": [], "end_ns": []}, dtype="int64")


def test_replay_without_cuts_reproduces_the_trace():
    out = replay(dependencies(two_ranks()), NO_SYNCS)
    assert (out["new_start_ns"] == out["start_ns"]).all()
    assert (out["new_end_ns"] == out["end_ns"]).all()


def test_removing_the_lateness_saves_it():
    """Rank 1 at rank 0's pace: [0,40) replayed in 10 ms -> the step ends at 25, not 55."""
    result = saving(two_ranks(), NO_SYNCS, [Compression(1, 0, 40 * MS, 10 * MS)])
    assert result["before_ns"] == 55 * MS
    assert result["after_ns"] == 25 * MS
    assert result["saving_ns"] == 30 * MS


def test_saving_is_capped_by_the_next_latest_rank():
    """A third rank arrives at 30: making rank 1 on time saves only 10 ms (40 -> 30)."""
    ops = two_ranks()
    third = pd.DataFrame(
        [
            op(2, 7, 20, 30, launch=20, name="gemm"),
            op(2, 20, 30, 45, launch=20, inst=0, transfer=5, name="allreduce"),
            op(2, 7, 45, 55, launch=21, name="B"),
        ]
    )
    ops = pd.concat([ops, third], ignore_index=True)
    result = saving(ops, NO_SYNCS, [Compression(1, 0, 40 * MS, 30 * MS)])
    assert result["saving_ns"] == 10 * MS


def test_host_sync_carries_the_earlier_finish_to_later_launches():
    """Rank 0's host blocks in a sync until B ends (55), then launches C (runs [56, 60)):
    in the what-if B ends at 25, the sync returns at 25 and C runs [26, 30)."""
    ops = pd.concat(
        [two_ranks(), pd.DataFrame([op(0, 7, 56, 60, launch=56, name="C")])], ignore_index=True
    )
    syncs = pd.DataFrame({"part": [0], "start_ns": [2 * MS], "end_ns": [55 * MS]})
    out = replay(dependencies(ops), syncs, [Compression(1, 0, 40 * MS, 10 * MS)])
    c = out[out["name"] == "C"].iloc[0]
    assert (c["new_start_ns"], c["new_end_ns"]) == (26 * MS, 30 * MS)


def test_compress_times_maps_inside_and_after():
    cut = [Compression(1, 10, 50, 20)]
    got = compress_times(
        pd.Series([0, 10, 30, 50, 70, 30]).to_numpy(), pd.Series([1, 1, 1, 1, 1, 0]).to_numpy(), cut
    )
    assert got.tolist() == [0, 10, 20, 30, 50, 30]


@pytest.mark.parametrize("seed", range(6))
def test_compress_times_of_many_cuts_is_the_sum_of_each_cuts_shift(seed):
    """Disjoint cuts (one sorted search) and overlapping ones (cut by cut) both give, per
    time, the sum of what each cut alone moves it: checked against the plain formula."""
    rng = np.random.default_rng(seed)
    edges = np.sort(rng.choice(np.arange(1, 100_000), 60, replace=False))
    disjoint = [
        Compression(0, int(a), int(b), int(rng.integers(0, b - a)))
        for a, b in zip(edges[::2], edges[1::2], strict=True)
    ]
    overlapping = [*disjoint, Compression(0, 10, 90_000, 5)]
    times = np.r_[rng.integers(-1, 100_100, 3_000), edges, edges + 1, edges - 1]
    parts = np.zeros(times.size, dtype=np.int64)
    for cuts in (disjoint, overlapping):
        want = times.copy()
        for c in cuts:
            length, t = c.end_ns - c.start_ns, times
            inside = (t > c.start_ns) & (t < c.end_ns) & (t >= 0)
            want[(t >= c.end_ns)] -= length - c.new_len_ns
            share = np.round((t[inside] - c.start_ns) / length * c.new_len_ns).astype(np.int64)
            want[inside] -= (t[inside] - c.start_ns) - share
        assert compress_times(times, parts, cuts).tolist() == want.tolist()


@pytest.mark.parametrize("seed", range(6))
def test_path_index_finds_the_op_that_ended_last_by_a_time(seed):
    """last_ended_by (one search of ends sorted once) against a plain scan of the part's ops:
    the latest end at or before t, ties to the highest row, -1 when none."""
    rng = np.random.default_rng(seed)
    n = 300
    ends = rng.integers(1, 60, n)  # ms, many ties on purpose
    starts = ends - rng.integers(0, 5, n)
    parts = rng.integers(0, 3, n)
    ops = pd.DataFrame([op(int(parts[i]), 7, int(starts[i]), int(ends[i])) for i in range(n)])
    g = dependencies(ops)  # rows in its own order: the index's rows are g's
    ix = path_index(g)
    part, end = g["part"].to_numpy(), g["end_ns"].to_numpy()
    for p in (0, 1, 2, 5):  # 5: no such part
        for t in [*rng.integers(-1, 62, 40).tolist(), *ends[:20].tolist()]:
            rows = np.flatnonzero((part == p) & (end <= t * MS))
            want = max(rows.tolist(), key=lambda i: (end[i], i), default=-1)
            assert ix.last_ended_by(p, t * MS) == want


def test_critical_path_runs_through_the_late_rank():
    g = dependencies(two_ranks())
    path = critical_path(g, 0, label_gap=lambda p, s, e: "idle: unknown")
    assert path[["rank", "what", "start_ns", "end_ns"]].values.tolist() == [
        [1, "idle: unknown", 0, 30 * MS],
        [1, "gemm", 30 * MS, 40 * MS],
        [0, "collective allreduce", 40 * MS, 45 * MS],
        [0, "B", 45 * MS, 55 * MS],
    ]
