"""Build small Nsight Systems SQLite exports in code, old and new schema generations.

``schema="new"`` looks like a 3.2x export (META_DATA_EXPORT, ENUM_* tables,
greenContextId, NVTX jsonText/binaryData); ``"3.28"`` adds what the current
documented schema (3.28.1) adds for what we read (``NVTX_EVENTS.eventId``);
``schema="old"`` is like the 2.9.1 export in the corpus (EXPORT_META_DATA, no
ENUM tables, a ``name`` column on RUNTIME). Only the columns stallscope reads,
plus a few it must ignore, are created. ``enum_shift`` renumbers the ENUM tables
of a new export, to prove they are read by name and not by a built-in id map.

Times are integer ns; ``pid``/``tid`` become ``globalTid``/``globalPid`` with
non-zero VM bits, as in real files.
"""

from __future__ import annotations

import gzip
import sqlite3
from pathlib import Path

VM = 1 << 48  # VM id 1 in bits 48-55, as real exports have

MEMCPY_OPER = ["UNKNOWN", "HTOD", "DTOH", "HTOA", "ATOH", "ATOA", "ATOD", "DTOA", "DTOD", "HTOH", "PTOP"]  # fmt: skip
MEM_KIND = ["PAGEABLE", "PINNED", "DEVICE", "ARRAY", "MANAGED", "DEVICE_STATIC", "MANAGED_STATIC", "UNKNOWN"]  # fmt: skip
MEM_EVENT_OPER = ["ALLOCATION", "DEALLOCATION"]
SYNC_TYPE = ["UNKNOWN", "EVENT_SYNCHRONIZE", "STREAM_WAIT_EVENT", "STREAM_SYNCHRONIZE", "CONTEXT_SYNCHRONIZE"]  # fmt: skip


def gpid(pid: int) -> int:
    return VM | (pid << 24)


def gtid(pid: int, tid: int) -> int:
    return VM | (pid << 24) | tid


class NsysBuilder:
    def __init__(self, schema: str = "new", enum_shift: int = 0):
        assert schema in ("old", "new", "3.28")
        self.schema = schema
        self.enum_shift = enum_shift  # new exports: ENUM ids = built-in id + shift
        self.strings: dict[str, int] = {}
        self.rows: dict[str, list[tuple]] = {}
        self.tables: set[str] = {"StringIds", "PROCESSES", "ThreadNames"}
        self.tables |= {
            "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS",
            "OSRT_API", "TARGET_INFO_GPU",
        }  # fmt: skip

    # -- helpers ------------------------------------------------------------------------
    def sid(self, text: str) -> int:
        if text not in self.strings:
            self.strings[text] = len(self.strings) + 1
        return self.strings[text]

    def enum(self, value: int) -> int:
        return value + self.enum_shift if self.schema != "old" else value

    def add(self, table: str, **cols) -> None:
        self.rows.setdefault(table, []).append(cols)

    def drop(self, *tables: str) -> NsysBuilder:
        self.tables -= set(tables)
        return self

    # -- content ------------------------------------------------------------------------
    def process(self, pid: int, name: str, threads: dict[int, str] | None = None) -> None:
        self.add("PROCESSES", globalPid=gpid(pid), pid=pid, name=name)
        for tid, tname in (threads or {}).items():
            self.add("ThreadNames", nameId=self.sid(tname), priority=0, globalTid=gtid(pid, tid))

    def _gpu_row(self, table, pid, device, stream, start, end, corr, context, **cols):
        self.add(table, start=start, end=end, deviceId=device, contextId=context, streamId=stream,
                 correlationId=corr, globalPid=gpid(pid), **cols)  # fmt: skip

    def kernel(self, pid, device, stream, start, end, corr, name, *, context=1, grid=(1, 1, 1),
               block=(128, 1, 1), regs=32, smem=(0, 0)):  # fmt: skip
        self._gpu_row("CUPTI_ACTIVITY_KIND_KERNEL", pid, device, stream, start, end, corr, context,
                      demangledName=self.sid(name), shortName=self.sid(name.split("(")[0]),
                      gridX=grid[0], gridY=grid[1], gridZ=grid[2],
                      blockX=block[0], blockY=block[1], blockZ=block[2], registersPerThread=regs,
                      staticSharedMemory=smem[0], dynamicSharedMemory=smem[1])  # fmt: skip

    def memcpy(self, pid, device, stream, start, end, corr, nbytes, kind, src, dst, *, context=1):
        self._gpu_row("CUPTI_ACTIVITY_KIND_MEMCPY", pid, device, stream, start, end, corr, context,
                      bytes=nbytes, copyKind=self.enum(MEMCPY_OPER.index(kind)),
                      srcKind=self.enum(MEM_KIND.index(src)),
                      dstKind=self.enum(MEM_KIND.index(dst)))  # fmt: skip

    def memset(self, pid, device, stream, start, end, corr, nbytes, mem="DEVICE", *, context=1):
        self._gpu_row("CUPTI_ACTIVITY_KIND_MEMSET", pid, device, stream, start, end, corr, context,
                      value=0, bytes=nbytes, memKind=self.enum(MEM_KIND.index(mem)))  # fmt: skip

    def sync(self, pid, device, stream, start, end, corr, sync_type, *, context=1):
        self._gpu_row("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", pid, device, stream, start, end, corr,
                      context, syncType=self.enum(SYNC_TYPE.index(sync_type)))  # fmt: skip

    def api(self, pid, tid, start, end, corr, name, event_class=0):
        self.add("CUPTI_ACTIVITY_KIND_RUNTIME", start=start, end=end, eventClass=event_class,
                 globalTid=gtid(pid, tid), correlationId=corr, nameId=self.sid(name))  # fmt: skip

    def domain(self, pid, tid, domain_id, name, start=1):
        self.add("NVTX_EVENTS", start=start, end=None, eventType=75, text=name,
                 globalTid=gtid(pid, tid), domainId=domain_id)  # fmt: skip

    def nvtx(self, pid, tid, start, end, text, *, domain_id=0, registered=False, event_type=59,
             json=None):  # fmt: skip
        inline, ref = (None, self.sid(text)) if registered else (text, None)
        self.add("NVTX_EVENTS", start=start, end=end, eventType=event_type, text=inline,
                 globalTid=gtid(pid, tid), textId=ref, domainId=domain_id, jsonText=json)  # fmt: skip

    def osrt(self, pid, tid, start, end, name):
        self.add("OSRT_API", start=start, end=end, eventClass=27, globalTid=gtid(pid, tid),
                 nameId=self.sid(name))  # fmt: skip

    def gpu(self, gpu_id, name="NVIDIA H200", sm=132):
        self.add("TARGET_INFO_GPU", vmId=VM, id=gpu_id, name=name, totalMemory=150109880320,
                 smCount=sm, cuDevice=gpu_id, maxRegistersPerBlock=65536, maxShmemPerBlock=49152,
                 maxShmemPerBlockOptin=232448, maxShmemPerSm=233472, maxRegistersPerSm=65536,
                 threadsPerWarp=32, maxWarpsPerSm=64, maxBlocksPerSm=32, maxThreadsPerBlock=1024,
                 computeMajor=9, computeMinor=0)  # fmt: skip

    def memory_usage(self, pid, device, start, address, nbytes, *, free=False, kind="DEVICE",
                     corr=None, name=None):  # fmt: skip
        """One CUDA_GPU_MEMORY_USAGE_EVENTS row (nsys profile --cuda-memory-usage=true)."""
        self.tables.add("CUDA_GPU_MEMORY_USAGE_EVENTS")
        self.add("CUDA_GPU_MEMORY_USAGE_EVENTS", start=start, globalPid=gpid(pid), deviceId=device,
                 contextId=1, address=address, pc=0, bytes=nbytes,
                 memKind=self.enum(MEM_KIND.index(kind)),
                 memoryOperationType=self.enum(MEM_EVENT_OPER.index("DEALLOCATION" if free else "ALLOCATION")),
                 name=name, correlationId=corr)  # fmt: skip

    def mpi_rank(self, pid, tid, rank):
        self.tables.add("MPI_RANKS")
        self.add("MPI_RANKS", globalTid=gtid(pid, tid), rank=rank)

    # -- output ---------------------------------------------------------------------------
    def write(self, path: Path) -> Path:
        path = Path(path)
        raw = path.with_name(path.name + ".tmp") if path.suffix == ".gz" else path
        raw.unlink(missing_ok=True)
        con = sqlite3.connect(raw)
        for sql in self._ddl():
            con.execute(sql)
        for text, ident in self.strings.items():
            con.execute("INSERT INTO StringIds VALUES (?, ?)", (ident, text))
        for table, rows in self.rows.items():
            for row in rows if table in self.tables else []:
                names = ", ".join(f'"{c}"' for c in row)
                marks = ", ".join("?" * len(row))
                con.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", tuple(row.values()))
        con.commit()
        con.close()
        if path.suffix == ".gz":
            path.write_bytes(gzip.compress(raw.read_bytes()))
            raw.unlink()
        return path

    def _ddl(self) -> list[str]:
        new = self.schema != "old"
        green = "greenContextId INTEGER, " if new else ""
        meta = "META_DATA_EXPORT" if new else "EXPORT_META_DATA"
        version = {"old": "2.9.1", "new": "3.20.3", "3.28": "3.28.1"}[self.schema]
        ddl = {
            "StringIds": "id INTEGER PRIMARY KEY, value TEXT NOT NULL",
            "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
            "ThreadNames": "nameId INTEGER, priority INTEGER, globalTid INTEGER",
            "CUPTI_ACTIVITY_KIND_KERNEL": (
                f'start INTEGER, "end" INTEGER, deviceId INTEGER, contextId INTEGER, {green}'
                "streamId INTEGER, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER, "
                "shortName INTEGER, gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, "
                "blockY INTEGER, blockZ INTEGER, registersPerThread INTEGER, "
                "staticSharedMemory INTEGER, dynamicSharedMemory INTEGER"
            ),
            "CUPTI_ACTIVITY_KIND_MEMCPY": (
                f'start INTEGER, "end" INTEGER, deviceId INTEGER, contextId INTEGER, {green}'
                "streamId INTEGER, correlationId INTEGER, globalPid INTEGER, bytes INTEGER, "
                "copyKind INTEGER, srcKind INTEGER, dstKind INTEGER"
            ),
            "CUPTI_ACTIVITY_KIND_MEMSET": (
                f'start INTEGER, "end" INTEGER, deviceId INTEGER, contextId INTEGER, {green}'
                "streamId INTEGER, correlationId INTEGER, globalPid INTEGER, value INTEGER, "
                "bytes INTEGER, memKind INTEGER"
            ),
            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
                f'start INTEGER, "end" INTEGER, deviceId INTEGER, contextId INTEGER, {green}'
                "streamId INTEGER, correlationId INTEGER, globalPid INTEGER, syncType INTEGER"
            ),
            "CUPTI_ACTIVITY_KIND_RUNTIME": (
                'start INTEGER, "end" INTEGER, eventClass INTEGER, globalTid INTEGER, '
                "correlationId INTEGER, nameId INTEGER" + (", name TEXT" if not new else "")
            ),
            "NVTX_EVENTS": (
                ("eventId INTEGER PRIMARY KEY NOT NULL, " if self.schema == "3.28" else "")
                + 'start INTEGER, "end" INTEGER, eventType INTEGER, text TEXT, globalTid INTEGER, '
                "textId INTEGER, domainId INTEGER, jsonText TEXT"
                + (", binaryData BLOB" if new else "")
            ),
            "OSRT_API": 'start INTEGER, "end" INTEGER, eventClass INTEGER, globalTid INTEGER, nameId INTEGER',
            "TARGET_INFO_GPU": (
                "vmId INTEGER, id INTEGER, name TEXT, totalMemory INTEGER, smCount INTEGER, "
                "cuDevice INTEGER, maxRegistersPerBlock INTEGER, maxShmemPerBlock INTEGER, "
                "maxShmemPerBlockOptin INTEGER, maxShmemPerSm INTEGER, maxRegistersPerSm INTEGER, "
                "threadsPerWarp INTEGER, maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER, "
                "maxThreadsPerBlock INTEGER, computeMajor INTEGER, computeMinor INTEGER"
            ),
            "MPI_RANKS": "globalTid INTEGER, rank INTEGER",
            "CUDA_GPU_MEMORY_USAGE_EVENTS": (
                "start INTEGER NOT NULL, globalPid INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                "contextId INTEGER NOT NULL, address INTEGER NOT NULL, pc INTEGER NOT NULL, "
                "bytes INTEGER NOT NULL, memKind INTEGER NOT NULL, "
                "memoryOperationType INTEGER NOT NULL, name TEXT, correlationId INTEGER"
            ),
        }
        # Every column a table really has, plus the rows this builder fills.
        out = [f"CREATE TABLE {t} ({cols})" for t, cols in ddl.items() if t in self.tables]
        out.append(f"CREATE TABLE {meta} (name TEXT, value TEXT)")
        out.append(f"INSERT INTO {meta} VALUES ('EXPORT_SCHEMA_VERSION', '{version}')")
        if new:
            out += self._enum_ddl()
        return out

    def _enum_ddl(self) -> list[str]:
        out = []
        for table, prefix, names in (
            ("ENUM_CUDA_MEMCPY_OPER", "CUDA_MEMCPY_KIND_", MEMCPY_OPER),
            ("ENUM_CUDA_MEM_KIND", "CUDA_MEMOPR_MEMORY_KIND_", MEM_KIND),
            ("ENUM_CUPTI_SYNC_TYPE", "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_", SYNC_TYPE),
            ("ENUM_CUDA_DEV_MEM_EVENT_OPER", "CUDA_DEV_MEM_EVENT_OPR_", MEM_EVENT_OPER),
        ):
            out.append(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name TEXT, label TEXT)")
            values = ", ".join(
                f"({i + self.enum_shift}, '{prefix}{n}', '{n.title()}')"
                for i, n in enumerate(names)
            )
            out.append(f"INSERT INTO {table} VALUES {values}")
        out.append(
            "CREATE TABLE ENUM_NSYS_EVENT_CLASS (id INTEGER PRIMARY KEY, name TEXT, label TEXT)"
        )
        out.append(
            "INSERT INTO ENUM_NSYS_EVENT_CLASS VALUES (0, 'TRACE_PROCESS_EVENT_CUDA_RUNTIME', 'CUDA runtime'),"
            " (1, 'TRACE_PROCESS_EVENT_CUDA_DRIVER', 'CUDA driver'), (27, 'TRACE_PROCESS_EVENT_OS_RUNTIME', 'OSRT'),"
            " (67, 'TRACE_PROCESS_EVENT_CUDABACKTRACE', 'CUDA backtrace')"
        )
        return out
