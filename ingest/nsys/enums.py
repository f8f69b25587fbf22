"""nsys enum values -> canonical words (copy kind, memory kind, sync type, API class).

Newer exports carry ``ENUM_*`` tables ``(id, name, label)``; they are read and
mapped **by name** (``CUDA_MEMOPR_MEMORY_KIND_PINNED`` -> ``pinned``), so a
renumbering in a future export is still read right. Older exports (schema
2.x, trimmed files) have no ENUM tables: the built-in maps below hold the
values those exports use (the same ids NVIDIA documents in the "SQLite Schema
Event Values" topic and ships in the ENUM tables of 3.x exports).
"""

from __future__ import annotations

import pyarrow as pa

from stallscope.ingest.nsys.db import NsysDb

# ENUM_CUDA_MEMCPY_OPER: id -> copy_kind. Array copies keep their own words;
# unified-memory (UVM) migrations map to the direction they move data.
COPY_KINDS = {
    1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
    8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD",
}  # fmt: skip
_COPY_NAMES = {
    "HTOD": "HtoD", "DTOH": "DtoH", "HTOA": "HtoA", "ATOH": "AtoH", "ATOA": "AtoA",
    "ATOD": "AtoD", "DTOA": "DtoA", "DTOD": "DtoD", "HTOH": "HtoH", "PTOP": "PtoP",
}  # fmt: skip
# ENUM_CUDA_MEM_KIND: id -> (canonical memory kind, label used in names).
MEM_KINDS = {
    0: ("pageable", "Pageable"), 1: ("pinned", "Pinned"), 2: ("device", "Device"),
    3: ("array", "Array"), 4: ("managed", "Managed"), 5: ("device", "Device"),
    6: ("managed", "Managed"),
}  # fmt: skip
# ENUM_CUPTI_SYNC_TYPE: id -> (sync_kind, Kineto's name for the event).
SYNC_KINDS = {
    1: ("event_sync", "Event Sync"),
    2: ("stream_wait_event", "Stream Wait Event"),
    3: ("stream_sync", "Stream Sync"),
    4: ("context_sync", "Context Sync"),
}
# ENUM_NSYS_EVENT_CLASS of CUPTI_ACTIVITY_KIND_RUNTIME rows -> host kind. Other
# classes (e.g. 67, CUDA backtrace: a copy of a call already in the table) are skipped.
API_CLASSES = {0: "runtime", 1: "driver"}


def enum_tables(db: NsysDb) -> dict[str, pa.Table]:
    """The small mapping tables the canonical SQL joins on, from the file or built in."""
    copy = _read(db, "ENUM_CUDA_MEMCPY_OPER", _copy_from_name) or dict(COPY_KINDS)
    mem = _read(db, "ENUM_CUDA_MEM_KIND", _mem_from_name) or dict(MEM_KINDS)
    sync = _read(db, "ENUM_CUPTI_SYNC_TYPE", _sync_from_name) or dict(SYNC_KINDS)
    api = _read(db, "ENUM_NSYS_EVENT_CLASS", _api_from_name) or dict(API_CLASSES)
    return {
        "enum_copy": pa.table(
            {"id": pa.array(list(copy), pa.int64()), "copy_kind": list(copy.values())}
        ),
        "enum_mem": pa.table(
            {
                "id": pa.array(list(mem), pa.int64()),
                "mem_kind": [v[0] for v in mem.values()],
                "label": [v[1] for v in mem.values()],
            }
        ),
        "enum_sync": pa.table(
            {
                "id": pa.array(list(sync), pa.int64()),
                "sync_kind": [v[0] for v in sync.values()],
                "label": [v[1] for v in sync.values()],
            }
        ),
        "enum_api": pa.table(
            {"id": pa.array(list(api), pa.int64()), "kind": list(api.values())},
        ),
    }


def _read(db: NsysDb, table: str, convert) -> dict:
    if not {"id", "name"} <= db.columns(table):
        return {}
    out = {}
    for ident, name in db.rows(f"SELECT id, name FROM {db.ref(table)}"):
        value = convert(str(name or "").upper())
        if isinstance(ident, int) and value is not None:
            out[ident] = value
    return out


def _copy_from_name(name: str) -> str | None:
    return _COPY_NAMES.get(name.rsplit("_", 1)[-1])


def _mem_from_name(name: str) -> tuple[str, str] | None:
    for word, value in (
        ("PAGEABLE", ("pageable", "Pageable")),
        ("PINNED", ("pinned", "Pinned")),
        ("MANAGED", ("managed", "Managed")),
        ("DEVICE", ("device", "Device")),
        ("ARRAY", ("array", "Array")),
    ):
        if word in name:
            return value
    return None  # UNKNOWN


def _sync_from_name(name: str) -> tuple[str, str] | None:
    for word, value in (
        ("STREAM_WAIT_EVENT", SYNC_KINDS[2]),
        ("EVENT_SYNCHRONIZE", SYNC_KINDS[1]),
        ("STREAM_SYNCHRONIZE", SYNC_KINDS[3]),
        ("CONTEXT_SYNCHRONIZE", SYNC_KINDS[4]),
    ):
        if name.endswith(word):
            return value
    return None


def _api_from_name(name: str) -> str | None:
    if name == "TRACE_PROCESS_EVENT_CUDA_RUNTIME":
        return "runtime"
    if name == "TRACE_PROCESS_EVENT_CUDA_DRIVER":
        return "driver"
    return None
