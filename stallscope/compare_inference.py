"""The inference part of ``stallscope compare``: time per output token and tokens/s, base vs new.

From the ``inference`` analyzer's metrics in each side's report (per device;
a side's figure is its slowest device's: the batch waits for the slowest
tensor-parallel rank). ``None`` when neither side is an inference job.
"""

from __future__ import annotations

from typing import Any

INFERENCE_METRICS = (
    ("decode_iter_ms_median", "time per output token, median (ms)"),
    ("decode_iter_ms_p90", "time per output token, p90 (ms)"),
    ("decode_iter_ms_max", "time per output token, max (ms)"),
    ("tokens_per_s", "tokens/s"),
    ("prefill_ms_median", "prefill, median (ms)"),
)


def inference_summary(report: dict[str, Any]) -> dict[str, float] | None:
    """The slowest device's decode figures (by median time per token), or None."""
    devices: dict[tuple, dict[str, float]] = {}
    for m in report["metrics"]:
        if m["name"] in dict(INFERENCE_METRICS) and m["value"] is not None:
            devices.setdefault((m["trace"], m["device"]), {})[m["name"]] = m["value"]
    rows = [row for row in devices.values() if "decode_iter_ms_median" in row]
    if not rows:
        return None
    return max(rows, key=lambda row: row["decode_iter_ms_median"])


def inference_deltas(base: dict | None, new: dict | None) -> list[dict[str, Any]] | None:
    """One row per figure: base, new, delta and delta % (None where a side lacks it)."""
    if base is None and new is None:
        return None
    rows = []
    for name, label in INFERENCE_METRICS:
        a, b = (base or {}).get(name), (new or {}).get(name)
        delta = None if a is None or b is None else round(b - a, 6)
        rows.append(
            {
                "metric": name,
                "label": label,
                "base": a,
                "new": b,
                "delta": delta,
                "delta_pct": round(100 * delta / a, 3) if delta is not None and a else None,
            }
        )
    return rows


def inference_table(result: dict[str, Any]) -> tuple[str, list[str], list[list[str]]] | None:
    """The rows as cells for the text/Markdown/HTML reports and the Compare page."""
    rows = result.get("inference")
    if not rows:
        return None

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:,.3f}"

    cells = [
        [
            row["label"],
            cell(row["base"]),
            cell(row["new"]),
            "-" if row["delta"] is None else f"{row['delta']:+,.3f}",
            "-" if row["delta_pct"] is None else f"{row['delta_pct']:+.1f}%",
        ]
        for row in rows
        if row["base"] is not None or row["new"] is not None
    ]
    return "Inference: decode", ["", "base", "new", "delta", "delta %"], cells
