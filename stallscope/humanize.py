"""Evidence and names in human units for people (no streamlit here).

Analyzers keep exact machine units in their evidence (integer ns, bytes, %);
the dashboard shows them through :func:`evidence_tables`: keys become words,
``*_ns`` values milliseconds, ``*_bytes`` MiB/GiB, ``*_pct`` percent,
``*_gbps`` GB/s, and lists of records become tables. :func:`short_kernel_name`
gives a readable short form of a (demangled) kernel name.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

MISSING = "—"  # a value the trace or the report does not give (None, NaN)

_WORDS = {"ns": "", "pct": "%", "gbps": "GB/s", "d2h": "DtoH", "h2d": "HtoD", "gpu": "GPU"}


def label(key: str) -> str:
    """``longest_gap_ns`` -> ``Longest gap (ms)``; ``share_of_span_pct`` -> ``Share of span (%)``."""
    parts = key.split("_")
    unit = _unit(key)
    words = [_WORDS.get(p, p) for p in parts if p not in ("ns", "pct", "gbps", "bytes")]
    text = " ".join(w for w in words if w) or key
    text = text[0].upper() + text[1:]
    return f"{text} ({unit})" if unit else text


def _unit(key: str) -> str:
    if key.endswith("_ns"):
        return "ms"
    if key.endswith("_pct"):
        return "%"
    if key.endswith("_gbps"):
        return "GB/s"
    if key.endswith("bytes"):
        return "MiB"
    return ""


def value_text(key: str, value: Any) -> str:
    """One evidence value as text in the unit :func:`label` names: :data:`MISSING` for
    None/NaN, a list of words comma-joined (``RING_LL, TREE``), numbers in the key's unit."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        if key.endswith("_ns"):
            return f"{value / 1e6:,.3f}"
        if key.endswith("bytes"):
            return f"{value / 2**20:,.2f}"
        if isinstance(value, float):
            return f"{value:,.2f}"
        return f"{value:,}"
    if isinstance(value, list | tuple) and all(isinstance(v, int | float) for v in value):
        return " × ".join(str(v) for v in value)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    return str(value)


def evidence_tables(
    evidence: dict[str, Any],
) -> tuple[pd.DataFrame, list[tuple[str, pd.DataFrame]]]:
    """(facts, tables): scalar facts as a two-column table (what, value) and every list of
    records (or dict of numbers) as its own table, all in human units; ``key`` is left out."""
    facts: list[dict[str, str]] = []
    tables: list[tuple[str, pd.DataFrame]] = []
    for key, value in evidence.items():
        if key == "key":
            continue
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables.append((label(key), records_table(value)))
        elif (
            isinstance(value, dict)
            and value
            and all(isinstance(v, int | float) for v in value.values())
        ):
            inner = "_ns" if key.endswith("_ns") else ""
            rows = [
                {"what": k, label(f"value{inner}"): value_text(inner or k, v)}
                for k, v in value.items()
            ]
            tables.append((label(key), pd.DataFrame(rows)))
        elif isinstance(value, dict):
            facts += [
                {"what": f"{label(key)}: {label(k)}", "value": value_text(k, v)}
                for k, v in value.items()
            ]
        else:
            facts.append({"what": label(key), "value": value_text(key, value)})
    return pd.DataFrame(facts, columns=["what", "value"]), tables


def records_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """A list of evidence records as a table: headers in words, values in human units;
    kernel names get a short form beside the full name."""
    frame = pd.DataFrame(records)
    out = pd.DataFrame(index=frame.index)
    for column in frame.columns:
        values = frame[column]
        if column in ("name", "kernel") and values.map(lambda v: isinstance(v, str)).all():
            out[column] = short_kernel_names(list(values))
            out[f"full {column}"] = values
            continue
        out[label(column)] = values.map(lambda v, c=column: value_text(c, v))
    return out


_TEMPLATE = re.compile(r"<[^<>]*>")
_PARENS = re.compile(r"\([^()]*\)")
_QUALIFIER = re.compile(r"\b[A-Za-z_]\w*::")
_LAMBDA_SCOPE = re.compile(r"::\{lambda[^}]*\}|::operator\s*(?:const)?|\{lambda[^}]*\}")


def _signature_removed(name: str) -> str:
    """The name without its return type and its argument list."""
    text = re.sub(r"^(?:__global__\s+)?void\s+", "", name.strip())
    depth = 0
    for i, char in enumerate(text):  # the argument list: the first '(' outside templates
        depth += (char == "<") - (char == ">")
        if char == "(" and depth == 0 and not text.startswith("(anonymous", i):
            return text[:i]
    return text


def short_kernel_name(name: str, detail: int = 0) -> str:
    """A readable short form of a kernel name.

    ``detail`` 0: ``void at::native::vectorized_elementwise_kernel<8, ...>(int, ...)`` ->
    ``at::native::vectorized_elementwise_kernel<…>`` (return type, arguments and template
    arguments elided). 1: the leaf name with two levels of template arguments, without
    namespaces, lambdas or argument lists:
    ``vectorized_elementwise_kernel<8, launch_clamp_scalar, array<char*, 2u> >``. 2: the full name.
    """
    if detail >= 2:
        return name
    text = _signature_removed(name)
    if detail == 0:
        previous = None
        while previous != text:
            previous, text = text, _TEMPLATE.sub("‹›", text)
        return text.replace("‹›", "<…>").strip() or name
    text = text.replace("(anonymous namespace)::", "")
    previous = None
    while previous != text:
        previous, text = text, _PARENS.sub("", text)
    text = _LAMBDA_SCOPE.sub("", text)
    text = _QUALIFIER.sub("", text)
    return _nested_templates_elided(text).strip() or name


def _nested_templates_elided(text: str, keep_depth: int = 2) -> str:
    """Template arguments nested deeper than ``keep_depth`` replaced by ``<…>``."""
    out, depth = [], 0
    for char in text:
        if char == "<":
            depth += 1
            if depth == keep_depth + 1:
                out.append("<…>")
            if depth > keep_depth:
                continue
        elif char == ">":
            depth -= 1
            if depth >= keep_depth:
                continue
        elif depth > keep_depth:
            continue
        out.append(char)
    return "".join(out)


# Wrappers whose template argument is the kernel's identity (cutlass::Kernel<the_gemm>).
_GENERIC_WRAPPER = re.compile(r"(?:^|::)(?:Kernel2?|device_kernel|kernel|launch_kernel)<…>$")


def short_kernel_names(names: list[str]) -> list[str]:
    """Short forms of ``names`` that stay distinct: names whose short forms collide get more
    detail (two levels of template arguments, then the full name); generic wrappers such
    as ``cutlass::Kernel<…>`` always show their template argument."""
    detail = [int(bool(_GENERIC_WRAPPER.search(short_kernel_name(n)))) for n in names]
    for _ in range(2):
        short = [short_kernel_name(n, d) for n, d in zip(names, detail, strict=True)]
        seen: dict[str, set[str]] = {}
        for full, s in zip(names, short, strict=True):
            seen.setdefault(s, set()).add(full)
        clashes = {s for s, fulls in seen.items() if len(fulls) > 1}
        if not clashes:
            return short
        detail = [d + (s in clashes) for d, s in zip(detail, short, strict=True)]
    return [short_kernel_name(n, d) for n, d in zip(names, detail, strict=True)]


def dashed(frame: pd.DataFrame, formats: dict[str, str]) -> pd.DataFrame:
    """A copy of ``frame`` for ``st.dataframe`` with each column in ``formats`` as text in its
    format (``"{:.1f}"``) and a missing value (None/NaN) as :data:`MISSING`: Streamlit draws a
    null cell as ``None`` and ignores a Styler's ``na_rep``. Those columns sort as text."""
    out = frame.copy()
    for column, fmt in formats.items():
        out[column] = [MISSING if pd.isna(v) else fmt.format(v) for v in frame[column]]
    return out


def significant(values: list[Any], digits: int = 3) -> pd.Series:
    """``values`` as a float column for a numeric table column: a missing value (None, NaN, not
    a number) is NaN (``st.dataframe`` shows its ``placeholder``, e.g. :data:`MISSING`, and the
    column still sorts as numbers); the others rounded to ``digits`` significant digits, never
    dropping integer digits (62.41 -> 62.4, 0.03123 -> 0.0312, 1234.5 -> 1234.0), so a small
    value does not print as 0.0."""

    def rounded(v: Any) -> float:
        try:
            x = float(v)
        except (TypeError, ValueError):
            return math.nan
        if not math.isfinite(x) or x == 0:
            return x
        return round(x, max(0, digits - 1 - math.floor(math.log10(abs(x)))))

    return pd.Series([rounded(v) for v in values], dtype="float64")
