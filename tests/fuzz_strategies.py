"""Hypothesis strategies for hostile Kineto and Nsight Systems inputs (tests and benchmarks).

The property checked with them (:func:`ingest_then_analyze`): an input either
ingests and then analyzes, or is refused with a :class:`StallscopeError`;
nothing else escapes, whatever the values.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import strategies as st

from stallscope.errors import StallscopeError
from stallscope.ingest import ingest_paths
from stallscope.report import build_report
from stallscope.store import Store
from tests.nsys_builder import NsysBuilder

INT64 = 2**63 - 1
edge_ints = st.one_of(
    st.integers(-1000, 10**7),
    st.sampled_from([0, -1, 2**31, -(2**31), INT64, -INT64 - 1, 2**62, 10**30, -(10**30)]),
)
json_scalars = st.one_of(
    st.none(), st.booleans(), edge_ints, st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)  # fmt: skip
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
kineto_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "i", "M", "f", "s", "?"]),
        "cat": st.sampled_from(["kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cpu_op",
                                "user_annotation", "gpu_user_annotation", "python_function", ""]),
        "name": st.one_of(st.text(max_size=20), st.sampled_from(["ProfilerStep#1", "ncclKernel_AllReduce"])),
        "pid": st.one_of(edge_ints, st.text(max_size=5)),
        "tid": st.one_of(edge_ints, st.text(max_size=5)),
        "ts": st.one_of(edge_ints, st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5)),
        "dur": st.one_of(edge_ints, st.floats(allow_nan=True, allow_infinity=True), st.none()),
    },
    optional={"args": st.dictionaries(st.sampled_from(["device", "stream", "correlation",
                                                      "External id", "grid", "block"]), json_values)},
)  # fmt: skip
kineto_doc = st.fixed_dictionaries(
    {
        "schemaVersion": st.just(1),
        "distributedInfo": st.fixed_dictionaries(
            {"rank": json_scalars, "world_size": json_scalars}
        ),
        "traceEvents": st.lists(kineto_event, min_size=1, max_size=25),
    }
)
sqlite_ints = st.one_of(  # what an INTEGER column can hold
    st.integers(-1000, 10**7), st.sampled_from([0, -1, 2**31, INT64, -INT64 - 1, 2**62, 2**53 + 1]),
)  # fmt: skip
nsys_kernel = st.tuples(
    sqlite_ints, sqlite_ints, st.integers(-2, 9), sqlite_ints, st.text(max_size=10)
)


def write_kineto(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(doc))
    return path


def write_nsys(kernels: list[tuple], path: Path) -> Path:
    b = NsysBuilder()
    b.process(100, "python", {100: "main"})
    b.gpu(0)
    for corr, (start, end, device, stream, name) in enumerate(kernels):
        b.kernel(
            100, device, stream, start, end, corr, name.encode("utf-8", "replace").decode() or "k"
        )
    return b.write(path)


def ingest_then_analyze(store_root: Path, path: Path) -> str:
    """``"ok"`` when ``path`` ingests and its job analyzes, ``"refused"`` on a StallscopeError."""
    store = Store(store_root)
    try:
        results = ingest_paths(store, [str(path)])
    except StallscopeError:
        return "refused"
    build_report(store, [store.traces(results[0].job_id)])
    return "ok"
