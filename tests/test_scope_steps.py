"""scope.launched_in_steps (step ranges merged once, one sorted search per launch) against
the plain SQL join of every GPU operation with every step range, on random tables."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from stallscope.scope import in_ranges, launched_in_steps

# the reference: every operation joined with every step range of its trace
JOIN_SQL = """
SELECT min(g.start_ns), max(g.end_ns)
FROM gpu g
LEFT JOIN host h ON h.trace_id = g.trace_id AND h.correlation = g.correlation AND h.kind IN ('runtime', 'driver')
JOIN ranges r ON r.trace_id = g.trace_id AND r.kind = 'step'
  AND coalesce(h.start_ns, g.start_ns) >= r.start_ns AND coalesce(h.start_ns, g.start_ns) < r.end_ns
WHERE g.trace_id = ? AND g.device = ? AND g.kind IN ('kernel', 'memcpy', 'memset')
"""


class _Job:
    """The one JobData call launched_in_steps makes, on a bare DuckDB connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.con = con

    def numpy(self, query: str, params: list) -> dict[str, np.ndarray]:
        return self.con.execute(query, params).fetchnumpy()


def _maybe_null(rng, values: np.ndarray, share: float) -> pd.Series:
    return pd.Series(values, dtype="Int64").mask(rng.random(values.size) < share)


def _random_job(seed: int, steps: int) -> duckdb.DuckDBPyConnection:
    """Two traces, two devices; ops launched (or not) by runtime/driver calls, some calls
    of another kind, some NULL times; steps that overlap, touch, are empty or reversed."""
    rng = np.random.default_rng(seed)
    n, m = 400, 300
    start = rng.integers(0, 100_000, n)
    gpu = pd.DataFrame(
        {
            "trace_id": rng.choice(["a", "b"], n),
            "device": rng.integers(0, 2, n),
            "kind": rng.choice(["kernel", "memcpy", "memset", "other"], n),
            "correlation": rng.integers(0, 300, n),
            "start_ns": _maybe_null(rng, start, 0.02),
            "end_ns": _maybe_null(rng, start + rng.integers(0, 2_000, n), 0.02),
        }
    )
    host = pd.DataFrame(
        {
            "trace_id": rng.choice(["a", "b"], m),
            "kind": rng.choice(["runtime", "driver", "cpu_op"], m),
            "correlation": rng.integers(0, 300, m),  # repeated: an op may have two launches
            "start_ns": _maybe_null(rng, rng.integers(0, 100_000, m), 0.05),
        }
    )
    lo = rng.integers(0, 100_000, steps)
    ranges = pd.DataFrame(
        {
            "trace_id": rng.choice(["a", "b"], steps),
            "kind": rng.choice(["step", "annotation"], steps, p=[0.8, 0.2]),
            "start_ns": _maybe_null(rng, lo, 0.05),
            "end_ns": _maybe_null(rng, lo + rng.integers(-500, 8_000, steps), 0.05),
        }
    )
    con = duckdb.connect()
    for name, frame in (("gpu", gpu), ("host", host), ("ranges", ranges)):
        con.register(f"_{name}", frame)
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM _{name}")
    return con


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("steps", [0, 1, 3, 40])
def test_launched_in_steps_is_the_join_with_every_step(seed, steps):
    con = _random_job(seed, steps)
    for trace in ("a", "b", "c"):
        for device in (0, 1):
            row = con.execute(JOIN_SQL, [trace, device]).fetchone()
            want = None if row is None or row[0] is None else (row[0], row[1])
            assert launched_in_steps(_Job(con), trace, device) == want


@pytest.mark.parametrize("seed", range(6))
def test_in_ranges_is_any_range_holding_the_point(seed):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, 1_000, 30)
    ends = starts + rng.integers(-50, 200, 30)  # empty and reversed ranges too
    points = np.r_[rng.integers(-10, 1_300, 500), starts, ends, ends - 1]
    want = [bool(((starts <= p) & (p < ends)).any()) for p in points.tolist()]
    assert in_ranges(starts, ends, points).tolist() == want
