"""Build a large Kineto trace by repeating a real one's events, shifted in time.

    python benchmarks/make_big_trace.py SRC.json[.gz] OUT.json --copies 9

Copy k (k = 0 .. copies-1) of every event is the original JSON text with:

* ``ts`` moved later by k * shift, where shift is the source's span (first
  start to last end) plus 1 ms, in whole microseconds. The integer part of the
  number is shifted as an integer and any decimals are kept as written, so
  times stay exact to the nanosecond;
* positive ``correlation``, ``External id``/``external id`` and flow ``id``
  values moved up by k * (largest id + 1), so they stay unique per copy and
  flow arrows still pair a launch with its own kernel;
* ``ProfilerStep#N`` renamed ``ProfilerStep#(N + k * (largest step + 1))``.

The header keys (``deviceProperties``, ``distributedInfo``...) are written
once, unchanged. Nothing else is touched.
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
from pathlib import Path

import msgspec

_TS = re.compile(rb'("ts"\s*:\s*)(-?\d+)(?=[.,\s}eE])')
_ID = re.compile(rb'("(?:correlation|External id|external id|id)"\s*:\s*)(\d+)(?=[,\s}])')
_STEP = re.compile(rb"(ProfilerStep#)(\d+)")
_EVENT_TIMES = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])  # to find the span


def _ns(text: bytes) -> int | None:
    """Exact µs text -> integer ns (plain decimal numbers only)."""
    match = re.fullmatch(rb"(-?)(\d+)(?:\.(\d{1,3}))?", text.strip(b'" '))
    if not match:
        return None
    sign = -1 if match.group(1) else 1
    return sign * (int(match.group(2)) * 1000 + int((match.group(3) or b"").ljust(3, b"0")))


def _adder(delta: int, keep_zero: bool = False):
    """re.sub callback: add ``delta`` to the integer in group 2 (0 stays 0 if asked)."""

    def add(match: re.Match) -> bytes:
        if keep_zero and match.group(2) == b"0":
            return match.group(0)
        return match.group(1) + str(int(match.group(2)) + delta).encode()

    return add


def load(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def build(src: bytes, copies: int, out) -> dict[str, int]:
    top = msgspec.json.decode(src, type=dict[str, msgspec.Raw])
    events = bytes(top.pop("traceEvents")).strip()
    assert events[:1] == b"[" and events[-1:] == b"]", "traceEvents is not an array"
    body = events[1:-1].strip()

    starts, ends = [], []
    for event in _EVENT_TIMES.decode(events):
        ts = _ns(bytes(event.get("ts", b"")))
        if ts is None or event.get("ph") == msgspec.Raw(b'"M"'):
            continue
        starts.append(ts)
        ends.append(ts + max(0, _ns(bytes(event.get("dur", b"0"))) or 0))
    span_us = -(-(max(ends) - min(starts)) // 1000)
    shift_us = span_us + 1000
    id_step = max((int(m.group(2)) for m in _ID.finditer(body)), default=0) + 1
    step_step = max((int(m.group(2)) for m in _STEP.finditer(body)), default=-1) + 1

    out.write(b"{\n")
    for key, value in top.items():
        out.write(msgspec.json.encode(key) + b": " + bytes(value) + b",\n")
    out.write(b'"traceEvents": [\n')
    for k in range(copies):
        if k:
            out.write(b",\n")
        if k == 0:
            out.write(body)
            continue
        text = _TS.sub(_adder(k * shift_us), body)
        text = _ID.sub(_adder(k * id_step, keep_zero=True), text)
        text = _STEP.sub(_adder(k * step_step), text)
        out.write(text)
        print(f"copy {k + 1}/{copies}", file=sys.stderr)
    out.write(b"\n]}\n")
    return {"events_per_copy": len(starts), "shift_us": shift_us, "id_step": id_step}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("src", type=Path, help="a real Kineto trace (.json or .json.gz)")
    parser.add_argument("out", type=Path, help="where to write the big .json")
    parser.add_argument("--copies", type=int, default=9, help="how many copies (default 9)")
    args = parser.parse_args()
    src = load(args.src)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    with open(tmp, "wb") as out:
        info = build(src, args.copies, out)
    tmp.replace(args.out)
    size = args.out.stat().st_size
    print(f"{args.out}: {size / 1e6:.1f} MB, {args.copies} copies, {info}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
