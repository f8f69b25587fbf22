"""Where does one ingest spend its time and memory? Stage by stage, one process.

    python benchmarks/profile_ingest.py benchmarks/data/df_index_resolver.json

Prints, per stage, wall and CPU seconds (CPU time is the steadier figure on a
busy machine; DuckDB's threads add to it) and the peak RSS reached during it (Linux:
the peak is reset before each stage through /proc/self/clear_refs). The
stages mirror ``ingest/job.py``: read and hash, decode (JSON -> Arrow; set
STALLSCOPE_DECODE_WORKERS=N for the worker processes the CLI would use),
canonical (DuckDB SQL), Parquet write. Imports are timed first. Like the CLI, pyarrow
is kept from importing pandas (set PANDAS_PROBE=1 to let it).
"""

from __future__ import annotations

import sys
import time

_T0 = time.perf_counter()


def _rss_mb() -> tuple[float, float]:
    now = peak = 0.0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                now = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return now, peak


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


class Stage:
    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        _reset_peak()
        self.t = time.perf_counter()
        self.cpu = time.process_time()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t
        cpu = time.process_time() - self.cpu
        now, peak = _rss_mb()
        print(
            f"{self.name:<12} {wall:7.3f} s wall {cpu:7.3f} s cpu"
            f"   rss {now:7.1f} MB   peak {peak:7.1f} MB"
        )


def main(path: str) -> None:
    import os
    import tempfile
    from pathlib import Path

    with Stage("imports"):
        import pyarrow.parquet as pq

        from stallscope.ingest.kineto.canonical import to_canonical
        from stallscope.ingest.kineto.decode import decode_kineto
        from stallscope.ingest.reader import expand_path
    if os.environ.get("PANDAS_PROBE") != "1":  # as in the CLI (ingest.startup.skip_pandas_probe)
        import pyarrow as pa

        try:
            from stallscope.ingest.startup import NoPandas as _NoPandas
        except ImportError:  # an older checkout
            try:
                from stallscope.ingest.kineto.decode import _NoPandas
            except ImportError:  # older still: it had no such thing
                _NoPandas = None
        if _NoPandas is not None:
            sys.meta_path.insert(0, blocker := _NoPandas())
            pa.array([0])
            sys.meta_path.remove(blocker)
    print(f"{'(start-up)':<12} {time.perf_counter() - _T0:7.3f} s wall")
    _, [source] = expand_path(path)
    try:
        from stallscope.ingest.kineto.parse import further_readers
        from stallscope.ingest.kineto.stream import decode_stream
    except ImportError:  # an older checkout: the file is read whole
        decode_stream = None
    if decode_stream is not None:  # as ingest does now: hashed, then decoded block by block
        with Stage("hash"):
            source.file_hash  # noqa: B018
        with Stage("decode"):  # with the [memory] rows
            decoded, _ = decode_stream(
                source.name, source.stream, "t", further_readers(), source.decompressed_size_hint()
            )
    else:
        with Stage("read+hash"):
            if hasattr(source, "load_hashed"):  # read and hashed in one pass, as ingest does
                source.load_hashed()
            else:  # an older checkout
                source.file_hash  # noqa: B018
            data = source.read()
            source.release()
        with Stage("memory"):
            try:
                from stallscope.ingest.kineto.memory import memory_table
            except ImportError:  # an older checkout
                memory_table = None
            if memory_table is not None:
                memory_table(data, "t")
        with Stage("decode"):
            decoded = decode_kineto(source.name, data)
        del data
    arrow_bytes = decoded.events.nbytes
    if hasattr(decoded, "gpu_args"):  # GPU args and unread events in tables of their own
        arrow_bytes += decoded.gpu_args.nbytes + decoded.others.nbytes
    print(f"{'':<12} {decoded.events.num_rows:,} events, {arrow_bytes / 1e6:.1f} MB Arrow")
    import inspect

    scratch = tempfile.TemporaryDirectory()  # the staging folder: streamed tables go there
    with Stage("canonical"):
        if "scratch" in inspect.signature(to_canonical).parameters:  # as ingest calls it
            canonical = to_canonical(decoded, "t", 0, Path(scratch.name))
        elif hasattr(decoded, "gpu_args"):
            canonical = to_canonical(decoded, "t", 0)
        else:  # an older checkout
            canonical = to_canonical(decoded.events, decoded.header, "t", 0)
    del decoded
    with Stage("write"), scratch as tmp:
        try:
            from stallscope.ingest.job import _write_tables  # as ingest writes: a few at a time
        except ImportError:  # an older checkout: one after the other
            _write_tables = None
        if _write_tables is not None:
            _write_tables(Path(tmp), canonical.tables())
        else:
            for name, table in canonical.tables().items():
                pq.write_table(
                    table, Path(tmp) / f"{name}.parquet", compression="zstd", compression_level=1
                )
    print(f"{'total':<12} {time.perf_counter() - _T0:7.3f} s wall {time.process_time():7.3f} s cpu")


if __name__ == "__main__":
    main(sys.argv[1])
