"""Read Nsight Compute CSV exports into plain columns, mapping columns by header name.

Two pages of ``ncu --import R.ncu-rep --csv`` are understood:

* ``--page raw`` (wide): one row per profiled kernel, one column per metric
  (``gpu__time_duration.sum``...), and a **units row** under the header
  (identifier cells empty);
* ``--page details`` (long, the default page): one row per (kernel, section,
  metric label) with ``Metric Unit``/``Metric Value``, plus **rule rows**
  (``Rule Name``, ``Rule Type``, ``Rule Description``, ``Estimated Speedup
  Type``, ``Estimated Speedup``).

Identifier columns (``ID``, ``Kernel Name``, ``Block Size``, ``Grid Size``,
``Device``, ``CC``...) are found by name: their set differs across ncu
versions (11, 12, 15 or 20 columns). Numbers carry the exporting machine's
thousands separators (``"2,209,728"``, ``"1.234,5"``, spaces); the locale is
decided once per file. ``==PROF==`` lines or program output before the
header are skipped. ``nan``/``n/a`` values keep their text and no number.

Contract: :func:`read_ncu_csv` returns an :class:`NcuCsv`: ``kernels`` (one
:class:`NcuKernel` per ``ID``) and ``metrics``, parallel lists of one entry
per non-empty value: ``kernel`` (the ID), ``section`` (details page; None on
the raw page), ``metric``, ``value`` (float in ``unit``, as exported, or
None), ``value_text`` (the text when it is not a number), ``unit``. Anything
malformed raises :class:`~stallscope.errors.InputError` with one line.
:func:`to_base` converts a value to base units (ns, bytes, Hz...) from its unit.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

from stallscope.errors import InputError

HEADER_START = '"ID","Process ID"'
RULE_PREFIX = "rule:"
_ID_COLUMNS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time",
               "Context", "Stream", "Block Size", "Grid Size", "Device", "CC")  # fmt: skip
_DETAIL_COLUMNS = ("Section Name", "Metric Name", "Metric Unit", "Metric Value", "Rule Name",
                   "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup")  # fmt: skip
_NOT_NUMBERS = {"nan", "-nan", "+nan", "inf", "-inf", "+inf", "n/a", "na", "-", "--"}
_GROUP_SPACES = re.compile(r"(?<=\d)[ \u00a0\u202f'\u2019](?=\d{3})")
# A comma that cannot be a thousands separator ("3,20", "0,8415"), or dots that must be ("1.234.567").
_DECIMAL_COMMA_HINT = re.compile(r"^[-+]?(\d+,(\d{1,2}|\d{4,})|\d{1,3}(\.\d{3}){2,}(,\d+)?)$")
_DOT_NUMBER = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)(\.\d*)?([eE][-+]?\d+)?$")
_COMMA_NUMBER = re.compile(r"^[-+]?(\d{1,3}(\.\d{3})+|\d+)(,\d*)?([eE][-+]?\d+)?$")
_TUPLE = re.compile(r"^\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)$")


@dataclass
class NcuKernel:
    """One profiled kernel launch (ncu result ``ID``) and how it was launched."""

    index: int
    name: str
    pid: int | None = None
    device: int | None = None
    stream: int | None = None
    cc: str | None = None
    block: tuple[int, int, int] | None = None
    grid: tuple[int, int, int] | None = None


@dataclass
class NcuCsv:
    """One CSV page: its kernels and its metric values (parallel lists)."""

    page: str  # "raw" or "details"
    kernels: dict[int, NcuKernel] = field(default_factory=dict)
    kernel: list[int] = field(default_factory=list)
    section: list[str | None] = field(default_factory=list)
    metric: list[str] = field(default_factory=list)
    value: list[float | None] = field(default_factory=list)
    value_text: list[str | None] = field(default_factory=list)
    unit: list[str | None] = field(default_factory=list)

    def add(self, kernel, section, metric, value, text, unit) -> None:
        self.kernel.append(kernel)
        self.section.append(section)
        self.metric.append(metric)
        self.value.append(value)
        self.value_text.append(text)
        self.unit.append(unit or None)


def read_ncu_csv(name: str, data: bytes) -> NcuCsv:
    """Parse one Nsight Compute CSV page (raw or details)."""
    rows = _rows(name, *_text_from_header(name, data))
    header = [h.strip() for h in rows[0][1]]
    for required in ("ID", "Kernel Name"):
        if required not in header:
            raise InputError(name, f"Nsight Compute CSV without a {required!r} column")
    if len(set(header)) != len(header):
        dup = next(h for h in header if header.count(h) > 1)
        raise InputError(name, f"Nsight Compute CSV names the column {dup!r} twice")
    body = rows[1:]
    locale_comma = _decimal_comma(body, header)
    if "Metric Name" in header and "Metric Value" in header:
        table = _details(name, header, body, locale_comma)
    else:
        table = _raw(name, header, body, locale_comma)
    if not table.kernels:
        raise InputError(name, "Nsight Compute CSV export with no profiled kernels")
    return table


def parse_number(text: str, decimal_comma: bool = False) -> float | None:
    """A CSV cell as a float (thousands separators removed), or None when it is no number."""
    cell = text.strip()
    if not cell or cell.lower() in _NOT_NUMBERS:
        return None
    if not decimal_comma and "," not in cell:
        try:
            return float(cell)
        except ValueError:
            pass
    cell = _GROUP_SPACES.sub("", cell)
    if decimal_comma:
        if not _COMMA_NUMBER.match(cell):
            return None
        cell = cell.replace(".", "").replace(",", ".")
    else:
        if not _DOT_NUMBER.match(cell):
            return None
        cell = cell.replace(",", "")
    try:
        return float(cell)
    except ValueError:
        return None


_PREFIX = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_TIME_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
            "second": 1e9, "s": 1e9}  # fmt: skip
_SCALED = re.compile(r"^([KkMGTP]?)((?i:byte|hz|inst|cycle|warp|thread|block|sector|request))$")


def to_base(value: float | None, unit: str | None) -> float | None:
    """``value`` in base units: times in **ns**, bytes, Hz (``Kbyte`` = 1000 bytes, as ncu uses
    SI prefixes; ``Tbyte/s`` -> bytes/s; ``Ghz`` -> Hz). Other units are returned unchanged."""
    if value is None or not unit:
        return value
    head = unit.split("/", 1)[0].strip()
    if head in _TIME_NS:
        return value * _TIME_NS[head]
    match = _SCALED.match(head)
    return value * _PREFIX[match.group(1)] if match else value


def _text_from_header(name: str, data: bytes) -> tuple[str, int]:
    """The text from the header line on, and how many lines came before it."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = data.decode("latin-1")  # Windows exports; every byte decodes
    if "\x00" in text[:65536]:
        raise InputError(name, "binary data, not an Nsight Compute CSV export")
    start = 0 if text.lstrip().startswith(HEADER_START) else text.find("\n" + HEADER_START) + 1
    if start == 0 and not text.lstrip().startswith(HEADER_START):
        raise InputError(name, 'not an Nsight Compute CSV export (no "ID","Process ID",... header)')
    skipped = text.count("\n", 0, start) + text[start:].count("\n", 0, _leading(text[start:]))
    return text[start:].lstrip(), skipped


def _leading(text: str) -> int:
    return len(text) - len(text.lstrip())


def _rows(name: str, text: str, skipped: int) -> list[tuple[int, list[str]]]:
    """(line number, cells) of every non-blank CSV record; the header first."""
    rows = []
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        for row in reader:
            if row:
                rows.append((reader.line_num + skipped, row))
    except csv.Error as exc:
        raise InputError(name, f"malformed Nsight Compute CSV ({exc})") from None
    if len(rows) < 2:
        raise InputError(name, "Nsight Compute CSV export with no profiled kernels")
    width = len(rows[0][1])
    for line, row in rows[1:]:
        if len(row) > width and any(cell.strip() for cell in row[width:]):
            raise InputError(
                name,
                f"malformed Nsight Compute CSV: line {line} has {len(row)} fields, "
                f"the header has {width}",
            )
    return rows


def _decimal_comma(body: list[tuple[int, list[str]]], header: list[str]) -> bool:
    """True when the file was written in a decimal-comma locale (``1.234,5``)."""
    skip = {i for i, h in enumerate(header) if h in _ID_COLUMNS and h not in ("ID", "CC")}
    for _, row in body[:200]:
        for i, cell in enumerate(row):
            if i not in skip and _DECIMAL_COMMA_HINT.match(cell.strip()):
                return True
    return False


def _kernel(name: str, header: list[str], row: list[str], comma: bool, number: int) -> NcuKernel:
    cells = dict(zip(header, row, strict=False))
    raw_id = cells.get("ID", "").strip()
    index = parse_number(raw_id, comma)
    if index is None or index != int(index) or index < 0:
        raise InputError(name, f"line {number}: result ID {raw_id!r} is not a number")

    def integer(column: str) -> int | None:
        value = parse_number(cells.get(column, ""), comma)
        return None if value is None else int(value)

    return NcuKernel(
        index=int(index),
        name=cells.get("Kernel Name", "").strip(),
        pid=integer("Process ID"),
        device=integer("Device"),
        stream=integer("Stream"),
        cc=cells.get("CC", "").strip() or None,
        block=_dims(cells.get("Block Size", "")),
        grid=_dims(cells.get("Grid Size", "")),
    )


def _dims(text: str) -> tuple[int, int, int] | None:
    match = _TUPLE.match(text.strip())
    return tuple(int(g) for g in match.groups()) if match else None  # type: ignore[return-value]


def _raw(name: str, header: list[str], body: list[tuple[int, list[str]]], comma: bool) -> NcuCsv:
    table = NcuCsv(page="raw")
    metric_columns = [i for i, h in enumerate(header) if h not in _ID_COLUMNS and h]
    id_col = header.index("ID")
    units: list[str] = [""] * len(header)
    for number, row in body:
        if not _cell(row, id_col).strip() and not _cell(row, header.index("Kernel Name")).strip():
            units = [_cell(row, i).strip() for i in range(len(header))]  # the units row
            continue
        kernel = _kernel(name, header, row, comma, number)
        if kernel.index in table.kernels:
            raise InputError(name, f"line {number}: result ID {kernel.index} appears twice")
        for i in metric_columns:
            text = _cell(row, i).strip()
            if text:
                value = parse_number(text, comma)
                table.add(
                    kernel.index,
                    None,
                    header[i],
                    value,
                    None if value is not None else text,
                    units[i],
                )
        _launch_from_metrics(kernel, table)
        table.kernels[kernel.index] = kernel
    return table


def _launch_from_metrics(kernel: NcuKernel, table: NcuCsv) -> None:
    """Older exports lack Block/Grid/Device columns: take them from launch__ metrics."""
    if kernel.block and kernel.grid and kernel.device is not None:
        return
    start = len(table.kernel) - 1
    values: dict[str, float] = {}
    while start >= 0 and table.kernel[start] == kernel.index:
        if table.metric[start].startswith("launch__") and table.value[start] is not None:
            values[table.metric[start]] = table.value[start]  # type: ignore[assignment]
        start -= 1

    def dims(prefix: str) -> tuple[int, int, int] | None:
        keys = [f"launch__{prefix}_dim_{axis}" for axis in "xyz"]
        return tuple(int(values[k]) for k in keys) if all(k in values for k in keys) else None  # type: ignore[return-value]

    kernel.block = kernel.block or dims("block")
    kernel.grid = kernel.grid or dims("grid")
    if kernel.device is None and "launch__device_id" in values:
        kernel.device = int(values["launch__device_id"])


def _details(
    name: str, header: list[str], body: list[tuple[int, list[str]]], comma: bool
) -> NcuCsv:
    table = NcuCsv(page="details")
    col = {h: header.index(h) for h in _DETAIL_COLUMNS if h in header}
    for number, row in body:
        kernel = table.kernels.get(_id_of(row, header))
        if kernel is None:
            kernel = _kernel(name, header, row, comma, number)
            table.kernels[kernel.index] = kernel
        section = _get(row, col, "Section Name") or None
        metric = _get(row, col, "Metric Name")
        rule = _get(row, col, "Rule Name")
        if metric:
            text = _get(row, col, "Metric Value")
            if text:
                value = parse_number(text, comma)
                table.add(kernel.index, section, metric, value, None if value is not None else text,
                          _get(row, col, "Metric Unit"))  # fmt: skip
        elif rule:
            kind, description = _get(row, col, "Rule Type"), _get(row, col, "Rule Description")
            speedup = parse_number(_get(row, col, "Estimated Speedup"), comma)
            scope = _get(row, col, "Estimated Speedup Type")
            text = f"{kind}: {description}" if kind else description
            table.add(kernel.index, section, RULE_PREFIX + rule, speedup, text or None,
                      f"% ({scope})" if scope else None)  # fmt: skip
    return table


def _id_of(row: list[str], header: list[str]) -> int | None:
    text = _cell(row, header.index("ID")).strip().replace(",", "").replace(".", "")
    return int(text) if text.isdigit() else None


def _cell(row: list[str], index: int) -> str:
    return row[index] if index < len(row) else ""


def _get(row: list[str], col: dict[str, int], name: str) -> str:
    index = col.get(name)
    return "" if index is None else _cell(row, index).strip()
