"""Render a report dict as text, JSON or Markdown (pure functions of the dict)."""

from __future__ import annotations

import json
from typing import Any

HEADLINE_METRICS = (
    "gpu_busy_pct",
    "gpu_idle_pct",
    "compute_pct",
    "comm_pct",
    "memcpy_pct",
    "kernel_count",
)
FORMATS = ("text", "json", "markdown")


def render(report: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report, indent=2, sort_keys=False) + "\n"
    if fmt == "markdown":
        return render_markdown(report)
    if fmt == "text":
        return render_text(report)
    raise ValueError(f"unknown format {fmt!r}")


def _metric_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per (trace, device) with the headline metrics."""
    names = {t["id"]: t.get("name") or t["id"] for t in report["traces"]}
    table: dict[tuple[str, Any], dict[str, Any]] = {}
    step: dict[str, Any] = {}
    for m in report["metrics"]:
        if m["device"] is None:
            if m["name"] == "step_time_ms_median":
                step[m["trace"]] = m["value"]
            continue
        table.setdefault((m["trace"], m["device"]), {"rank": m["rank"]})[m["name"]] = m["value"]
    rows = []
    for (trace, device), values in table.items():
        row = [trace, _short(names.get(trace, trace), 32), str(values["rank"]), str(device)]
        row += [_fmt_value(values.get(name)) for name in HEADLINE_METRICS]
        row.append(_fmt_value(step.get(trace)))
        rows.append(row)
    return rows


_METRIC_HEADER = [
    "trace",
    "name",
    "rank",
    "gpu",
    "busy %",
    "idle %",
    "compute %",
    "comm %",
    "memcpy %",
    "kernels",
    "step ms (median)",
]


def render_text(report: dict[str, Any]) -> str:
    lines = [
        f"stallscope report ({len(report['traces'])} traces, {len(report['findings'])} findings)",
        "",
    ]
    rows = _metric_rows(report)
    if rows:
        lines += _table(_METRIC_HEADER, rows)
    else:
        lines.append("No GPU activity in these traces.")
    lines.append("")
    if not report["findings"]:
        lines.append("No findings.")
    for f in report["findings"]:
        where = f"trace {f['trace']} rank {f['rank']}" + (
            "" if f["device"] is None else f" gpu {f['device']}"
        )
        lines.append(
            f"[{f['severity'].upper()}] {f['title']}  ({f['analyzer']}; {where}; {f['impact_ns'] / 1e6:.2f} ms lost)"
        )
        lines.append(f"    {f['detail']}")
        lines.append(f"    Fix: {f['recommendation']}")
    return "\n".join(lines) + "\n"


def render_markdown(report: dict[str, Any]) -> str:
    lines = ["## stallscope report", ""]
    rows = _metric_rows(report)
    if rows:
        lines.append("| " + " | ".join(_METRIC_HEADER) + " |")
        lines.append("|" + "---|" * len(_METRIC_HEADER))
        lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    else:
        lines.append("No GPU activity in these traces.")
    lines += ["", f"### Findings ({len(report['findings'])})", ""]
    if not report["findings"]:
        lines.append("No findings.")
    for f in report["findings"]:
        lines.append(
            f"- **{f['severity'].upper()}** {_md(f['title'])} — `{f['analyzer']}`, trace `{f['trace']}`, "
            f"rank {f['rank']}, {f['impact_ns'] / 1e6:.2f} ms lost"
        )
        lines.append(f"  - {_md(f['detail'])}")
        lines.append(f"  - Fix: {_md(f['recommendation'])}")
    return "\n".join(lines) + "\n"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [
        fmt.format(*r) for r in rows
    ]


def _fmt_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
