"""Fuzz the Kineto and Nsight Systems readers (briefly here; longer: benchmarks/fuzz_readers.py).

Property: whatever the values, an input ingests and then analyzes, or is
refused with a StallscopeError -- never another exception.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.fuzz_strategies import (  # noqa: E402
    ingest_then_analyze,
    kineto_doc,
    nsys_kernel,
    write_kineto,
    write_nsys,
)

# Brief: a dozen examples each, no shrinking (a shrink can take minutes; the
# benchmark script shrinks). A failure prints the example and its seed.
BRIEF = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


@BRIEF
@given(doc=kineto_doc)
def test_kineto_reader_never_fails_unexpectedly(doc):
    with tempfile.TemporaryDirectory() as tmp:
        path = write_kineto(doc, Path(tmp) / "fuzz.pt.trace.json")
        assert ingest_then_analyze(Path(tmp) / "store", path) in ("ok", "refused")


@BRIEF
@given(kernels=st.lists(nsys_kernel, min_size=1, max_size=6))
def test_nsys_reader_never_fails_unexpectedly(kernels):
    with tempfile.TemporaryDirectory() as tmp:
        path = write_nsys(kernels, Path(tmp) / "fuzz.sqlite")
        assert ingest_then_analyze(Path(tmp) / "store", path) in ("ok", "refused")
