"""Render a report dict as text, JSON, Markdown or HTML (pure functions of the dict)."""

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
FORMATS = ("text", "json", "markdown", "html")


def render(report: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report, indent=2, sort_keys=False) + "\n"
    if fmt == "markdown":
        return render_markdown(report)
    if fmt == "text":
        return render_text(report)
    if fmt == "html":
        return render_html(report)
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


def _no_timeline(report: dict[str, Any]) -> str:
    """What stands in for the metrics table when no trace has a GPU timeline."""
    from stallscope.ingest.registry import of_source, provides

    sources = {t.get("source") for t in report["traces"]}
    if sources and not any(provides(s, "timeline") for s in sources):
        titles = sorted(f.title for s in sources if (f := of_source(s)) is not None)
        return (
            f"No GPU timeline: {' and '.join(titles) or 'no timeline format'} only (add a Kineto "
            "or nsys trace of the same program for time-based metrics)."
        )
    return "No GPU activity in these traces."


def _warnings(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(trace name, warning) of every trace, in report order."""
    return [(t.get("name") or t["id"], w) for t in report["traces"] for w in t.get("warnings", [])]


def render_text(report: dict[str, Any]) -> str:
    lines = [
        f"stallscope report ({_count(len(report['traces']), 'trace')}, {_count(len(report['findings']), 'finding')})",
        "",
    ]
    rows = _metric_rows(report)
    if rows:
        lines += _table(_METRIC_HEADER, rows)
    else:
        lines.append(_no_timeline(report))
    lines.append("")
    lines += [f"Warning: {name}: {text}" for name, text in _warnings(report)]
    if not report["findings"]:
        lines.append("No findings.")
    for f in report["findings"]:
        where = f"trace {f['trace']} rank {f['rank']}" + (
            "" if f["device"] is None else f" gpu {f['device']}"
        )
        lines.append(
            f"[{f['severity'].upper()}] {f['title']}  ({f['analyzer']}; {where}; {f['impact_ns'] / 1e6:.2f} ms lost{_saving(f)})"
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
        lines.append(_no_timeline(report))
    warnings = [
        f"> Warning: {_md_line(name)}: {_md_line(text)}" for name, text in _warnings(report)
    ]
    lines += ["", *warnings] if warnings else []
    lines += ["", f"### Findings ({len(report['findings'])})", ""]
    if not report["findings"]:
        lines.append("No findings.")
    for f in report["findings"]:
        lines.append(
            f"- **{f['severity'].upper()}** {_md_line(f['title'])} — `{f['analyzer']}`, trace `{f['trace']}`, "
            f"rank {f['rank']}, {f['impact_ns'] / 1e6:.2f} ms lost{_saving(f)}"
        )
        lines.append(f"  - {_md_line(f['detail'])}")
        lines.append(f"  - Fix: {_md_line(f['recommendation'])}")
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
    """Text for a Markdown table cell: pipes escaped, one line."""
    return _md_line(text).replace("|", "\\|")


_MD_SPECIALS = "\\`*_[]<>!"


def _md_line(text: str) -> str:
    """Trace text for a Markdown line outside tables, shown literally: one line; the characters
    that make emphasis, code, links, images or HTML backslash-escaped (a kernel named
    ``<img src=x>`` or ``![a](http://h/p)`` prints as text); pipes kept."""
    return "".join("\\" + c if c in _MD_SPECIALS else c for c in str(text).replace("\n", " "))


_HTML_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #212121; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
td { max-width: 36em; overflow-wrap: anywhere; }
th { background: #f5f5f5; }
.sev { font-weight: bold; text-transform: uppercase; }
.critical { color: #b71c1c; } .high { color: #e65100; } .medium { color: #f9a825; }
.low { color: #558b2f; } .info { color: #546e7a; }
"""


def render_html(report: dict[str, Any]) -> str:
    """One self-contained page: headline table, time-by-cause chart (plotly.js inlined), findings.

    The page loads no script, style or font from the network, so it opens offline.
    """
    from html import escape

    from stallscope.charts import time_by_cause_figure

    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>stallscope report</title>',
        f"<style>{_HTML_STYLE}</style></head><body>",
        "<h1>stallscope report</h1>",
        f"<p>{len(report['traces'])} trace(s), {len(report['findings'])} finding(s); "
        f"schema <code>{escape(report['schema'])}</code>.</p>",
    ]
    rows = _metric_rows(report)
    if rows:
        parts.append(
            "<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in _METRIC_HEADER) + "</tr>"
        )
        parts += ["<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
        figure = time_by_cause_figure(report)
        figure.update_layout(
            title="GPU time by cause", template="plotly_white"
        )  # not pio.templates.default
        parts.append(
            figure.to_html(
                full_html=False,
                include_plotlyjs=True,
                div_id="stallscope-time-by-cause",
                config={"displaylogo": False, "responsive": True},
            )
        )
    else:
        parts.append(f"<p>{escape(_no_timeline(report))}</p>")
    parts += [f"<p><b>Warning</b>: {escape(n)}: {escape(w)}</p>" for n, w in _warnings(report)]
    parts.append(f"<h2>Findings ({len(report['findings'])})</h2>")
    if not report["findings"]:
        parts.append("<p>No findings.</p>")
    else:
        header = ("severity", "analyzer", "finding", "where", "ms lost", "ms saved if fixed", "fix")
        parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr>")
        for f in report["findings"]:
            where = f"trace {f['trace']} rank {f['rank']}" + (
                "" if f["device"] is None else f" gpu {f['device']}"
            )
            parts.append(
                f'<tr><td class="sev {escape(f["severity"])}">{escape(f["severity"])}</td>'
                f"<td>{escape(f['analyzer'])}</td>"
                f"<td><b>{escape(f['title'])}</b><br>{escape(f['detail'])}</td>"
                f"<td>{escape(where)}</td><td>{f['impact_ns'] / 1e6:.2f}</td>"
                f"<td>{_saving_ms(f)}</td>"
                f"<td>{escape(f['recommendation'])}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _saving(finding: dict[str, Any]) -> str:
    """``", saves ~X ms if fixed"`` where the finding estimates its saving, else ``""``."""
    saving = finding.get("saving_ns")
    return "" if saving is None else f", saves ~{saving / 1e6:.2f} ms if fixed"


def _saving_ms(finding: dict[str, Any]) -> str:
    saving = finding.get("saving_ns")
    return "—" if saving is None else f"{saving / 1e6:.2f}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
