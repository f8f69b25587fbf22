"""Render a report dict as text, JSON, Markdown or HTML (pure functions of the dict)."""

from __future__ import annotations

import json
import re
import statistics
from typing import Any

import msgspec

from stallscope.finding_groups import grouped_findings, percentile, spread_text

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
        return render_json(report)
    if fmt == "markdown":
        return render_markdown(report)
    if fmt == "text":
        return render_text(report)
    if fmt == "html":
        return render_html(report)
    raise ValueError(f"unknown format {fmt!r}")


def render_json(report: dict[str, Any]) -> str:
    """``json.dumps(report, indent=2)`` plus a newline, byte for byte, ~10x faster.

    With ``indent`` Python's json falls back to its pure-Python encoder (~1 s for a
    128-rank report); here its C encoder writes the text compact and msgspec re-indents
    it, keeping every number's and string's text as written. A report holding NaN or
    Infinity (which msgspec does not read) takes ``json.dumps``'s own path.
    """
    compact = json.dumps(report).encode()
    try:
        return msgspec.json.format(compact, indent=2).decode() + "\n"
    except msgspec.DecodeError:
        return json.dumps(report, indent=2) + "\n"


def _metric_records(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per (trace, device): ``trace``, ``rank``, ``device`` and the headline
    metrics' values by name (``step`` = the trace's median step ms), in report order."""
    step: dict[str, Any] = {}
    table: dict[tuple[str, Any], dict[str, Any]] = {}
    for m in report["metrics"]:
        if m["device"] is None:
            if m["name"] == "step_time_ms_median":
                step[m["trace"]] = m["value"]
            continue
        key = (m["trace"], m["device"])
        table.setdefault(key, {"trace": m["trace"], "rank": m["rank"], "device": m["device"]})
        table[key][m["name"]] = m["value"]
    for record in table.values():
        record["step"] = step.get(record["trace"])
    return list(table.values())


def _metric_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per (trace, device) with the headline metrics."""
    names = {t["id"]: t.get("name") or t["id"] for t in report["traces"]}
    rows = []
    for r in _metric_records(report):
        row = [r["trace"], _short(names.get(r["trace"], r["trace"]), 32), str(r["rank"])]
        row += [str(r["device"]), *(_fmt_value(r.get(name)) for name in HEADLINE_METRICS)]
        row.append(_fmt_value(r["step"]))
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
TABLE_ROWS_MAX = 8  # more (trace, GPU) rows than this: the metrics as distributions over GPUs
_SPREAD_HEADER = ["metric", "GPUs", "min", "at", "median", "p99", "max", "at"]


def _metrics_table(report: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """(caption, header, rows) of the headline metrics: one row per (trace, GPU) up to
    :data:`TABLE_ROWS_MAX` rows (caption empty), else one row per metric with its
    distribution over the GPUs (min, median, p99, max) and where the extremes are."""
    records = _metric_records(report)
    if len(records) <= TABLE_ROWS_MAX:
        return "", _METRIC_HEADER, _metric_rows(report)
    where = _where_label(report, records)
    rows = []
    for name, label in zip((*HEADLINE_METRICS, "step"), _METRIC_HEADER[4:], strict=True):
        have = [r for r in records if r.get(name) is not None]
        if not have:
            continue
        values = [r[name] for r in have]
        low = min(have, key=lambda r: r[name])
        high = max(have, key=lambda r: r[name])
        rows.append([
            label, str(len(have)), _fmt_value(low[name]), where(low),
            _fmt_value(_median(values)),
            _fmt_value(percentile(values, 99)), _fmt_value(high[name]), where(high),
        ])  # fmt: skip
    ranks = len({(r["trace"], r["rank"]) for r in records})
    caption = (
        f"Headline metrics of {len(records)} GPUs in {ranks} traces (ranks): each one's "
        "distribution over the GPUs that have it (GPUs), the extremes' ranks in 'at' (the JSON "
        "report has every GPU's values)."
    )
    return caption, _SPREAD_HEADER, rows


def _median(values: list[Any]) -> Any:
    """The median, an int when the values are ints and it is whole (a count stays a count)."""
    median = statistics.median(values)
    whole = all(isinstance(v, int) for v in values) and median == int(median)
    return int(median) if whole else median


def _where_label(report: dict[str, Any], records: list[dict[str, Any]]):
    """Function naming a metrics record briefly: ``rank R`` (``gpu D`` added when a rank has
    several GPUs; ``trace T`` first when the report holds several jobs)."""
    jobs = {t["job"] for t in report["traces"]}
    per_rank: dict[tuple[str, Any], int] = {}
    for r in records:
        per_rank[(r["trace"], r["rank"])] = per_rank.get((r["trace"], r["rank"]), 0) + 1
    several_gpus = any(n > 1 for n in per_rank.values())

    def label(r: dict[str, Any]) -> str:
        text = f"rank {r['rank']}" + (f" gpu {r['device']}" if several_gpus else "")
        return f"trace {r['trace']} {text}" if len(jobs) > 1 else text

    return label


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


def _groups(report: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The report's findings grouped across ranks (within each job), worst first."""
    jobs = {t["id"]: t.get("job") or t["id"] for t in report["traces"]}
    return grouped_findings(report["findings"], jobs)


def _findings_count(report: dict[str, Any], groups: list[list[dict[str, Any]]]) -> str:
    """``"769 findings in 12 entries"`` (``"6 findings"`` when none are grouped)."""
    text = _count(len(report["findings"]), "finding")
    if len(groups) < len(report["findings"]):
        text += f" in {len(groups)} {'entry' if len(groups) == 1 else 'entries'}"
    return text


def _where(f: dict[str, Any]) -> str:
    return f"trace {f['trace']} rank {f['rank']}" + (
        "" if f["device"] is None else f" gpu {f['device']}"
    )


def _selection_lines(report: dict[str, Any]) -> list[str]:
    """Which ranks the per-rank analyzers ran on, and why (jobs above the triage threshold)."""
    lines = []
    for sel in report.get("rank_selection", []):
        analyzed = sel["analyzed"]
        if sel["all_ranks"]:
            lines.append(
                f"Ranks analyzed in detail (job {sel['job']}): all {sel['ranks']} (--all-ranks)."
            )
            continue
        lines.append(
            f"Ranks analyzed in detail (job {sel['job']}): {len(analyzed)} of {sel['ranks']}. "
            f"Above {sel['threshold']} ranks the per-rank analyzers run on the ranks a first pass "
            "over every rank found out of line, and on median ranks for reference; the others were "
            "screened only (analyze --all-ranks analyzes every rank)."
        )
        lines += [f"  rank {a['rank']}: {a['why']}" for a in analyzed]
    return lines


def render_text(report: dict[str, Any]) -> str:
    groups = _groups(report)
    lines = [
        f"stallscope report ({_count(len(report['traces']), 'trace')}, {_findings_count(report, groups)})",
        "",
    ]
    caption, header, rows = _metrics_table(report)
    if rows:
        lines += [caption] if caption else []
        lines += _table(header, rows)
    else:
        lines.append(_no_timeline(report))
    lines.append("")
    selection = _selection_lines(report)
    lines += [*selection, ""] if selection else []
    lines += [f"Warning: {name}: {text}" for name, text in _warnings(report)]
    if not report["findings"]:
        lines.append("No findings.")
    for group in groups:
        f = group[0]
        lines.append(
            f"[{f['severity'].upper()}] {f['title']}  ({f['analyzer']}; {_where(f)}; {f['impact_ns'] / 1e6:.2f} ms lost{_saving(f)})"
        )
        if len(group) > 1:
            lines.append(f"    {spread_text(group)}")
        lines.append(f"    {f['detail']}")
        lines.append(f"    Fix: {f['recommendation']}")
    return "\n".join(lines) + "\n"


def render_markdown(report: dict[str, Any]) -> str:
    groups = _groups(report)
    lines = ["## stallscope report", ""]
    caption, header, rows = _metrics_table(report)
    if rows:
        lines += [_md_line(caption), ""] if caption else []
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    else:
        lines.append(_no_timeline(report))
    selection = _selection_lines(report)
    lines += (
        [
            "",
            *(
                _md_line(line) if not line.startswith("  ") else f"- {_md_line(line.strip())}"
                for line in selection
            ),
        ]
        if selection
        else []
    )
    warnings = [
        f"> Warning: {_md_line(name)}: {_md_line(text)}" for name, text in _warnings(report)
    ]
    lines += ["", *warnings] if warnings else []
    count = len(report["findings"])
    entries = f" in {len(groups)} entries" if len(groups) < count else ""
    lines += ["", f"### Findings ({count}{entries})", ""]
    if not report["findings"]:
        lines.append("No findings.")
    for group in groups:
        f = group[0]
        lines.append(
            f"- **{f['severity'].upper()}** {_md_line(f['title'])} — `{f['analyzer']}`, trace `{f['trace']}`, "
            f"rank {f['rank']}, {f['impact_ns'] / 1e6:.2f} ms lost{_saving(f)}"
        )
        if len(group) > 1:
            lines.append(f"  - {_md_line(spread_text(group))}")
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


# Cells wrap at spaces and at the <wbr> that _cell puts in long identifiers, never inside a
# word ("CRITICA L"); a table wider than the page scrolls sideways in its .scroll box.
_HTML_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #212121; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
td { max-width: 36em; overflow-wrap: normal; word-break: normal; hyphens: manual; }
td.prose { min-width: 14em; } td.num, td.sev { white-space: nowrap; }
th { background: #f5f5f5; }
h2.chart { margin: 1.2em 0 0.2em; font-size: 1.2em; }
.sev { font-weight: bold; text-transform: uppercase; }
.critical { color: #b71c1c; } .high { color: #e65100; } .medium { color: #f9a825; }
.low { color: #558b2f; } .info { color: #546e7a; }
"""


_BREAK_AFTER = re.compile(r"(?<=[_./:,=])")  # identifier separators: a line may break after them
_LONG_WORD = 12  # characters: words this short (a trace id) are never given break points


def _cell(text: str) -> str:
    """HTML-escaped cell text whose long words (kernel names, paths, trace files) may break
    after ``_ . / : , =`` (``<wbr>``), so a narrow column wraps between an identifier's parts
    instead of inside a word, or of overflowing."""
    from html import escape

    words = re.split(r"(\s+)", str(text))
    return "".join(
        "<wbr>".join(escape(part) for part in _BREAK_AFTER.split(w))
        if len(w) > _LONG_WORD
        else escape(w)
        for w in words
    )


def render_html(report: dict[str, Any]) -> str:
    """One self-contained page: headline table, time-by-cause chart (plotly.js inlined), findings.

    The page loads no script, style or font from the network, so it opens offline.
    """
    from html import escape

    from stallscope.charts import time_by_cause_figure

    groups = _groups(report)
    entries = f" in {len(groups)} entries" if len(groups) < len(report["findings"]) else ""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>stallscope report</title>',
        f"<style>{_HTML_STYLE}</style></head><body>",
        "<h1>stallscope report</h1>",
        f"<p>{len(report['traces'])} trace(s), {len(report['findings'])} finding(s){entries}; "
        f"schema <code>{escape(report['schema'])}</code>.</p>",
    ]
    caption, header, rows = _metrics_table(report)
    if rows:
        parts += [f"<p>{escape(caption)}</p>"] if caption else []
        parts.append(
            '<div class="scroll"><table><tr>'
            + "".join(f"<th>{escape(h)}</th>" for h in header)
            + "</tr>"
        )
        parts += ["<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table></div>")
        charted, title = _chart_report(report)
        figure = time_by_cause_figure(charted)
        figure.update_layout(template="plotly_white")  # not pio.templates.default
        # the title as a heading above the chart: inside the figure, the legend (above the
        # plot, as many rows as the width needs) was drawn over it
        parts.append(f'<h2 class="chart">{escape(title)}</h2>')
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
    selection = _selection_lines(report)
    if selection:
        parts.append(f"<p>{escape(selection[0])}</p>")
        items = [f"<li>{escape(line.strip())}</li>" for line in selection[1:]]
        parts += ["<ul>", *items, "</ul>"] if items else []
    parts += [f"<p><b>Warning</b>: {escape(n)}: {escape(w)}</p>" for n, w in _warnings(report)]
    parts.append(f"<h2>Findings ({len(report['findings'])}{entries})</h2>")
    if not report["findings"]:
        parts.append("<p>No findings.</p>")
    else:
        header = ("severity", "analyzer", "finding", "where", "ms lost", "ms saved if fixed", "fix")
        parts.append(
            '<div class="scroll"><table><tr>' + "".join(f"<th>{h}</th>" for h in header) + "</tr>"
        )
        for group in groups:
            f = group[0]  # the worst speaks for the group
            where = _cell(_where(f))
            if len(group) > 1:
                where = f"worst: {where}<br>{_cell(spread_text(group))}"
            parts.append(
                f'<tr><td class="sev {escape(f["severity"])}">{escape(f["severity"])}</td>'
                f"<td>{_cell(f['analyzer'])}</td>"
                f'<td class="prose"><b>{_cell(f["title"])}</b><br>{_cell(f["detail"])}</td>'
                f'<td>{where}</td><td class="num">{f["impact_ns"] / 1e6:.2f}</td>'
                f'<td class="num">{_saving_ms(f)}</td>'
                f'<td class="prose">{_cell(f["recommendation"])}</td></tr>'
            )
        parts.append("</table></div>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


CHART_GPUS_MAX = 16  # GPUs drawn in the HTML report's time-by-cause chart


def _chart_report(report: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(the report the time-by-cause chart draws, its title): every GPU up to
    :data:`CHART_GPUS_MAX`, else the report narrowed to the GPUs with the most idle time."""
    records = _metric_records(report)
    if len(records) <= CHART_GPUS_MAX:
        return report, "GPU time by cause"
    idlest = sorted(records, key=lambda r: -(r.get("gpu_idle_pct") or 0))[:CHART_GPUS_MAX]
    keep = {(r["trace"], r["device"]) for r in idlest}
    metrics = [m for m in report["metrics"] if (m["trace"], m["device"]) in keep]
    title = f"GPU time by cause: the {CHART_GPUS_MAX} idlest of {len(records)} GPUs"
    return {**report, "metrics": metrics}, title


def _saving(finding: dict[str, Any]) -> str:
    """``", saves ~X ms if fixed"`` where the finding estimates its saving, else ``""``."""
    saving = finding.get("saving_ns")
    return "" if saving is None else f", saves ~{saving / 1e6:.2f} ms if fixed"


def _saving_ms(finding: dict[str, Any]) -> str:
    saving = finding.get("saving_ns")
    return "—" if saving is None else f"{saving / 1e6:.2f}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
