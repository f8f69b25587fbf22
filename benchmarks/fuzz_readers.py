"""Fuzz the Kineto and Nsight Systems readers for longer than CI does.

    .venv/bin/python benchmarks/fuzz_readers.py [EXAMPLES]   (default 500 per reader)

Same property as tests/test_fuzz_readers.py: an input ingests and then
analyzes, or is refused with a StallscopeError. Prints the outcome counts;
a failing example is shrunk and printed by Hypothesis, and the exit code is 1.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.fuzz_strategies import (  # noqa: E402
    ingest_then_analyze,
    kineto_doc,
    nsys_kernel,
    write_kineto,
    write_nsys,
)


def main(examples: int) -> int:
    outcomes: Counter[str] = Counter()
    config = settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))

    @config
    @given(doc=kineto_doc)
    def kineto(doc):
        with tempfile.TemporaryDirectory() as tmp:
            path = write_kineto(doc, Path(tmp) / "fuzz.pt.trace.json")
            outcomes["kineto " + ingest_then_analyze(Path(tmp) / "store", path)] += 1

    @config
    @given(kernels=st.lists(nsys_kernel, min_size=1, max_size=8))
    def nsys(kernels):
        with tempfile.TemporaryDirectory() as tmp:
            path = write_nsys(kernels, Path(tmp) / "fuzz.sqlite")
            outcomes["nsys " + ingest_then_analyze(Path(tmp) / "store", path)] += 1

    failed = 0
    for target in (kineto, nsys):
        try:
            target()
        except Exception as exc:  # noqa: BLE001 (report and go on to the next reader)
            print(f"FAILED {target.__name__}: {type(exc).__name__}: {exc}")
            failed = 1
    for key, count in sorted(outcomes.items()):
        print(f"{key:16} {count}")
    return failed


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 500))
