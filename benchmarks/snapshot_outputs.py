"""Snapshot and compare ingest outputs, to prove a speed change alters nothing.

    python benchmarks/snapshot_outputs.py snap OUT_DIR FILE...   # ingest each file alone
    python benchmarks/snapshot_outputs.py compare DIR_A DIR_B    # exit 1 on any difference
    python benchmarks/snapshot_outputs.py edge DIR               # write awkward small traces

``snap`` ingests every file as its own job into a fresh store and copies each
trace's Parquet tables and ``meta.json`` (minus the fields that change from
run to run: upload time, ingest seconds) into ``OUT_DIR/<n>-<file name>/``
(a file of several traces, such as an nsys export of two GPUs: each trace's
files prefixed ``<k>-``, in the store's trace order);
an input error is kept as ``error.txt``. ``compare`` checks that both
snapshots hold the same files and that every table has the same schema and
the same rows with the same values; tables whose rows match but come in
another order (rows with equal sort keys) are listed separately.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

_VOLATILE = {"uploaded_at", "ingest_seconds", "stallscope_version"}


def snap(out_dir: Path, files: list[str]) -> None:
    from stallscope.errors import StallscopeError
    from stallscope.ingest import ingest_paths
    from stallscope.store import Store

    out_dir.mkdir(parents=True, exist_ok=True)
    for index, file in enumerate(files):
        target = out_dir / f"{index:03d}-{Path(file).name}"
        target.mkdir()
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "store").ensure()
            try:
                [result] = ingest_paths(store, [file], uploaded_by="bench")
            except StallscopeError as exc:
                (target / "error.txt").write_text(str(exc) + "\n")
                continue
            refs = store.traces(result.job_id)
            for index, ref in enumerate(refs):
                # One trace: its files as they are named; several (an nsys export's
                # processes or GPUs): each file prefixed with the trace's position.
                prefix = f"{index}-" if len(refs) > 1 else ""
                for parquet in sorted(ref.path.glob("*.parquet")):
                    shutil.copy(parquet, target / f"{prefix}{parquet.name}")
                meta = {k: v for k, v in ref.meta.items() if k not in _VOLATILE}
                text = json.dumps(meta, indent=1, sort_keys=True)
                (target / f"{prefix}meta.json").write_text(text)
        print(f"{target.name}: {len(list(target.iterdir()))} files")


# Awkward but real-world spellings: every column's slow path in the decoder.
_EDGE_EVENTS = [
    '{"ph":"X","cat":"kernel","name":"k1","pid":0,"tid":"stream 7","ts":1712195495519689.047,"dur":3.5,'
    '"args":{"device":0,"stream":7,"correlation":5,"grid":[1,2,3],"block":[4,5,6],"registers per thread":32,'
    '"shared memory":0,"blocks per SM":0.5,"warps per SM":2,"est. achieved occupancy %":25,"External id":9}}',
    '{"ph":"X","cat":"Kernel","name":"ncclDevKernel_AllReduce","pid":"0","tid":7,"ts":"12.5","dur":"1e1",'
    '"args":{"device":"0","stream":"7","correlation":1.0,"grid":[1,2],"block":"x","Collective name":"allreduce",'
    '"In msg nelems":99999999999999999999999,"Out msg nelems":-3,"Group size":2.7,"dtype":"Float",'
    '"Process Group Name":"0","Process Group Ranks":[0,1],"Seq":"12","external id":4}}',
    '{"ph":"X","cat":"cpu_op","name":"op","pid":-5,"tid":true,"ts":-1.25,"dur":-2,'
    '"args":{"registers per thread":true,"blocks per SM":"x","warps per SM":null,"seq":3,"bytes":1e3}}',
    '{"ph":"X","cat":"gpu_memcpy","name":"Memcpy HtoD (Pinned -> Device)","pid":1,"tid":2,"ts":1e6,'
    '"dur":0.001,"args":{"device":1,"stream":2,"correlation":6,"bytes":4096,"kind":null}}',
    '{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":{"a":1},"tid":[1],"ts":5,"dur":1,'
    '"args":{"correlation":5,"External id":"9","stream":"s1"}}',
    '{"ph":"M","name":"process_name","pid":0,"tid":0,"args":{"name":"python"}}',
    '{"ph":"M","name":"thread_name","pid":0,"tid":"t9","args":{"name":7}}',
    '{"ph":"X","cat":"user_annotation","name":"ProfilerStep#3","pid":0,"tid":1,"ts":1,"dur":100}',
    '{"ph":"X","cat":"gpu_user_annotation","name":"fwd","pid":0,"tid":7,"ts":2,"dur":10,"args":{"device":0}}',
    '{"ph":"X","cat":"cuda_sync","name":"Stream Sync","pid":0,"tid":7,"ts":3,"dur":1,'
    '"args":{"cuda_sync_kind":"Stream Synchronize","wait_on_stream":3.0}}',
    '{"ph":"X","cat":"kernel","name":"nots","pid":0,"tid":7,"dur":1}',
    '{"ph":"i","cat":"cpu_instant_event","name":"mark","pid":0,"tid":1,"ts":7,"s":"t"}',
    '{"ph":"X","cat":"kernel","name":"big","pid":0,"tid":7,"ts":99999999999999999999,"dur":1,'
    '"args":{"grid":[1.5,2,3],"block":[1,null,3],"shared memory":9223372036854775808}}',
    '{"ph":"X","cat":"\u212aernel","name":"kelvin","pid":0,"tid":7,"ts":20,"dur":1,'
    '"args":{"device":0,"stream":7,"grid":[2,2,2]}}',
    '{"ph":"X","cat":"KERNEL","name":"upper","pid":0,"tid":7,"ts":21.5,"dur":1,'
    '"args":{"device":0,"stream":7,"block":[8,1,1],"bytes":"12"}}',
    '{"ph":"X","cat":"CPU_OP","name":"ProfilerStep#9","pid":0,"tid":1,"ts":22,"dur":9}',
    '{"ph":"X","cat":"cpu_op","name":"ProfilerStep#x","pid":0,"tid":1,"ts":23,"dur":1}',
    '{"ph":"X","cat":"\u0130cpu_op","name":"dotted","pid":0,"tid":1,"ts":24,"dur":1}',
    '{"ph":"X","cat":"cuda_runtime","name":"late","pid":0,"tid":1,"ts":"25","dur":"2.5"}',
]


def edge(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    body = ",\n".join(_EDGE_EVENTS)
    head = '{"schemaVersion":1,"distributedInfo":{"rank":0,"world_size":1},"traceEvents":['
    files = {
        "edge_object.json": head + body + "]}",
        "edge_bare_array.json": "[" + body + "]",
        "edge_nan_control.json": head + body.replace('"dur":3.5', '"dur":NaN') + ',\n{"ph":"X",'
        '"cat":"cpu_op","name":"tab\there","pid":1,"tid":1,"ts":Infinity,"dur":1}]}',
        "edge_bad_event.json": head + body + ',\n{"ph":"X","cat":"cpu_op","name":"bad","ts":}]}',
        "edge_non_event.json": head + body + ",\n42]}",
        "edge_empty.json": head + "]}",
    }
    for name, text in files.items():
        (out_dir / name).write_text(text)
        print(out_dir / name)


def compare(dir_a: Path, dir_b: Path, strict_order: bool = False) -> int:
    import pyarrow.parquet as pq

    problems, reordered, one_side = [], [], set()
    names_a = sorted(p.name for p in dir_a.iterdir())
    names_b = sorted(p.name for p in dir_b.iterdir())
    if names_a != names_b:
        problems.append(f"different inputs: {set(names_a) ^ set(names_b)}")
    checked = 0
    for name in sorted(set(names_a) & set(names_b)):
        files_a = {p.name for p in (dir_a / name).iterdir()}
        files_b = {p.name for p in (dir_b / name).iterdir()}
        if "error.txt" in files_a ^ files_b:
            problems.append(f"{name}: an error on one side only")
            continue
        one_side.update(files_a ^ files_b)  # a table added to the store since, say
        for file in sorted(files_a & files_b):
            pa_, pb_ = dir_a / name / file, dir_b / name / file
            if file.endswith(".parquet"):
                ta, tb = pq.read_table(pa_), pq.read_table(pb_)
                if ta.schema != tb.schema:
                    problems.append(f"{name}/{file}: schema differs")
                elif ta.equals(tb):
                    checked += ta.num_rows
                elif _same_rows(ta, tb):
                    reordered.append(f"{name}/{file}")
                    checked += ta.num_rows
                else:
                    problems.append(
                        f"{name}/{file}: values differ ({ta.num_rows} vs {tb.num_rows} rows)"
                    )
            elif pa_.read_bytes() != pb_.read_bytes():
                problems.append(f"{name}/{file}: differs")
    for problem in problems:
        print(problem)
    for table in reordered:
        print(f"{table}: same rows, another order among rows with equal sort keys")
    if one_side:
        print(f"not compared (in one snapshot only): {', '.join(sorted(one_side))}")
    print(
        f"{len(names_a)} inputs, {checked:,} rows compared, {len(problems)} differences,"
        f" {len(reordered)} tables with the same rows in another order"
    )
    return 1 if problems or (strict_order and reordered) else 0


def _same_rows(ta, tb) -> bool:
    """Same multiset of rows (order aside)."""
    import duckdb

    if ta.num_rows != tb.num_rows:
        return False
    con = duckdb.connect()
    con.register("a", ta)
    con.register("b", tb)
    [(extra,)] = con.sql(
        "SELECT count(*) FROM ((SELECT * FROM a EXCEPT ALL SELECT * FROM b)"
        " UNION ALL (SELECT * FROM b EXCEPT ALL SELECT * FROM a))"
    ).fetchall()
    return extra == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snap")
    s.add_argument("out_dir", type=Path)
    s.add_argument("files", nargs="+")
    c = sub.add_parser("compare")
    c.add_argument("dir_a", type=Path)
    c.add_argument("dir_b", type=Path)
    c.add_argument("--strict-order", action="store_true", help="fail on reordered rows too")
    e = sub.add_parser("edge")
    e.add_argument("out_dir", type=Path)
    args = parser.parse_args()
    if args.cmd == "edge":
        edge(args.out_dir)
        return 0
    if args.cmd == "snap":
        snap(args.out_dir, args.files)
        return 0
    return compare(args.dir_a, args.dir_b, args.strict_order)


if __name__ == "__main__":
    sys.exit(main())
