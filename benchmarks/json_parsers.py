"""Why msgspec: decode one Kineto file with json, orjson and msgspec.

    python benchmarks/json_parsers.py [TRACE.json] [--runs 3]

Each parser decodes the whole file in a fresh process (so peak memory is its
own), ``--runs`` times; the table gives the best time and the memory the
decoded objects take (peak RSS minus RSS with the file's bytes loaded).

* ``json``, ``orjson``, ``msgspec (dicts)``: the whole document as Python
  dicts and lists, what a generic loader (HTA's, for one) builds;
* ``msgspec (stallscope structs)``: what ``ingest/kineto/decode.py`` does,
  typed structs holding only the fields stallscope reads, ``ts``/``dur`` kept
  as exact text.

orjson is optional (skipped if it is not installed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

_CHILD = r"""
import json, sys, time
def rss():
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line[:5]] = int(line.split()[1]) / 1024
    return out
parser, path = sys.argv[1], sys.argv[2]
if parser == "json":
    decode = json.loads
elif parser == "orjson":
    import orjson
    decode = orjson.loads
elif parser == "msgspec (dicts)":
    import msgspec
    decode = msgspec.json.Decoder().decode
else:
    import gc
    from stallscope.ingest.kineto import decode as kd
    def decode(data):
        gc.disable()
        top = kd._TOP.decode(data)
        return kd._EVENTS_LIST.decode(top["traceEvents"])
data = open(path, "rb").read()
before = rss()["VmRSS"]
t = time.perf_counter()
value = decode(data)
seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "objects_mb": rss()["VmHWM"] - before}))
"""

PARSERS = ("json", "orjson", "msgspec (dicts)", "msgspec (stallscope structs)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "trace", nargs="?", type=Path, default=HERE / "data" / "df_index_resolver.json"
    )
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    mb = args.trace.stat().st_size / 1e6
    print(f"{args.trace.name}: {mb:.1f} MB, best of {args.runs} runs, one process each\n")
    print("| parser | seconds | MB/s | decoded objects, MB | x file size |")
    print("|---|---:|---:|---:|---:|")
    for name in PARSERS:
        results = []
        for _ in range(args.runs):
            proc = subprocess.run(
                [sys.executable, "-c", _CHILD, name, str(args.trace)],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                if "No module named 'orjson'" in proc.stderr:
                    break
                sys.exit(proc.stderr)
            results.append(json.loads(proc.stdout))
        if not results:
            print(f"| {name} | not installed | | | |")
            continue
        best = min(r["seconds"] for r in results)
        objects = max(r["objects_mb"] for r in results)
        print(f"| {name} | {best:.2f} | {mb / best:.0f} | {objects:.0f} | {objects / mb:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
