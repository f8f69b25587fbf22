"""The SQL (DuckDB) that turns the raw nsys tables into canonical rows.

Stages ``PREPARE_STEPS`` build, from the raw Arrow tables of ``tables`` (one
raw table at a time: it can be released once its step has run):

* ``api``  — CUDA runtime/driver calls, ``_v<N>`` suffix stripped from names;
* ``g``    — GPU activities with their process, names (kernel names from
  StringIds; memcpy/memset/sync names spelled like Kineto's) and enum words;
* ``launch`` — each GPU activity's launch call, joined on **process and
  correlation id** (never correlation alone: ids repeat across processes);
* ``nv``   — NVTX ranges with text, per-process domain names and step numbers.

``pairs`` (which launch calls fall inside which NVTX range) is built by
:mod:`canonical` with a range join; the ``*_OUT_SQL`` queries then emit
the canonical tables of every trace at once, tagged with the trace index
``tix`` (rows shared by the GPUs of one process appear once per GPU trace).
Times stay integer nanoseconds throughout; a row is kept when ``end >= start``
and the two are not both 0 (CUPTI's "timestamp not collected").
"""

from __future__ import annotations

from stallscope.ingest.comm import COMM_NAME_REGEX

# What becomes a step: an NVTX range, outside the NCCL domain, whose whole text
# is ProfilerStep#N, or (when a process has no ProfilerStep#N range) step N /
# Step_N / step#N / iteration N.
PROFILER_STEP_REGEX = r"^ProfilerStep#(\d+)$"
STEP_REGEX = r"^(?:ProfilerStep#|[Ss]tep[ _#]?|[Ii]teration[ _#]?)(\d+)$"
# NCCL-domain ranges of operations that launch communication kernels.
NCCL_OP_REGEX = (
    r"^nccl(AllReduce|AllGather|ReduceScatter|Reduce|Broadcast|Bcast|Send|Recv|AllToAll"
    r"|Alltoall|GroupEnd)"
)

# Stage by stage, each once its raw table is loaded, in this order (``PREPARE_STEPS``).
PREPARE_API_SQL = r"""
CREATE TEMP TABLE api AS
SELECT r.start AS start_ns, r."end" AS end_ns, coalesce(r.gp, -1) AS gp, coalesce(r.tid, -1) AS tid,
       r.correlation,
       regexp_replace(coalesce(r.name_txt, s.value, 'unknown CUDA API call'), '_v[0-9]+$', '') AS name,
       CASE WHEN r.api_class IS NULL THEN
              CASE WHEN regexp_matches(name, '^cu[A-Z]') THEN 'driver' ELSE 'runtime' END
            ELSE e.kind END AS kind
FROM runtime r
LEFT JOIN strings s ON s.id = r.name_id
LEFT JOIN enum_api e ON e.id = r.api_class
WHERE r."end" >= r.start AND (r.start <> 0 OR r."end" <> 0) AND (r.api_class IS NULL OR e.kind IS NOT NULL);
"""

PREPARE_GPU_SQL = r"""

-- Only for exports whose GPU tables lack globalPid: the process of the launch call.
CREATE TEMP TABLE corr_gp AS
SELECT correlation, min(gp) AS gp FROM api
WHERE correlation IN (SELECT correlation FROM act WHERE gp IS NULL)
GROUP BY correlation HAVING count(DISTINCT gp) = 1;

-- nsys writes deviceId 0 on every synchronization row: its context tells the real GPU.
CREATE TEMP TABLE ctx_dev AS
SELECT gp, context, min(device) AS device FROM act
WHERE kind <> 'sync' AND context IS NOT NULL AND device IS NOT NULL
GROUP BY 1, 2 HAVING count(DISTINCT device) = 1;

CREATE TEMP TABLE g AS
SELECT a.gid, a.kind, a.start AS start_ns, a."end" AS end_ns,
  CAST(coalesce(CASE WHEN a.kind = 'sync' THEN cx.device END, a.device, -1) AS INTEGER) AS device,
  CASE WHEN a.stream IS NULL OR a.stream = 4294967295 THEN -1 ELSE a.stream END AS stream,
  a.correlation,
  coalesce(a.gp, c.gp, (SELECT CASE WHEN count(DISTINCT gp) = 1 THEN min(gp) END FROM api), -1) AS gp,
  CASE a.kind
    WHEN 'kernel' THEN coalesce(a.name_txt, s.value, 'unknown kernel')
    WHEN 'graph' THEN 'CUDA graph ' || coalesce(CAST(a.name_id AS VARCHAR), '?') || ' (whole-graph trace)'
    WHEN 'memcpy' THEN 'Memcpy ' || coalesce(ec.copy_kind, 'Unknown') || ' ('
                       || coalesce(ms.label, 'Unknown') || ' -> ' || coalesce(md.label, 'Unknown') || ')'
    WHEN 'memset' THEN 'Memset (' || coalesce(md.label, 'Unknown') || ')'
    ELSE coalesce(es.label, 'Unknown Sync') END AS name,
  a.grid_x, a.grid_y, a.grid_z, a.block_x, a.block_y, a.block_z, a.registers,
  a.smem_static, a.smem_dynamic, a.bytes,
  ec.copy_kind, ms.mem_kind AS src_kind, md.mem_kind AS dst_kind, es.sync_kind
FROM act a
LEFT JOIN strings s ON a.kind = 'kernel' AND s.id = a.name_id
LEFT JOIN corr_gp c ON a.gp IS NULL AND c.correlation = a.correlation
LEFT JOIN ctx_dev cx ON a.kind = 'sync' AND cx.gp = a.gp AND cx.context = a.context
LEFT JOIN enum_copy ec ON ec.id = a.copy_id
LEFT JOIN enum_mem ms ON ms.id = a.src_id
LEFT JOIN enum_mem md ON md.id = a.dst_id
LEFT JOIN enum_sync es ON es.id = a.sync_id
WHERE a."end" >= a.start AND (a.start <> 0 OR a."end" <> 0);

CREATE TEMP TABLE launch AS
SELECT g.gid, arg_min(a.tid, a.start_ns) AS tid, min(a.start_ns) AS launch_ns
FROM g JOIN api a ON a.gp = g.gp AND a.correlation = g.correlation
GROUP BY g.gid;

-- What is still needed from the raw table once it is released.
CREATE TEMP TABLE act_stats AS SELECT
  (SELECT count(*) FROM act) - (SELECT count(*) FROM g) AS dropped,
  (SELECT count(*) FROM g WHERE kind = 'graph') AS graphs;
"""

PREPARE_OS_SQL = r"""
CREATE TEMP TABLE os AS
SELECT coalesce(o.gp, -1) AS gp, coalesce(o.tid, -1) AS tid, o.start AS start_ns, o."end" AS end_ns,
       coalesce(o.name_txt, s.value, 'unknown OS call') AS name
FROM osrt o LEFT JOIN strings s ON s.id = o.name_id
WHERE o."end" >= o.start AND (o.start <> 0 OR o."end" <> 0);
"""

PREPARE_NVTX_SQL = r"""
-- What is still needed from the raw table once it is released.
CREATE TEMP TABLE thread_marks AS
SELECT n.gp, coalesce(n.text, s.value) AS text FROM nvtx n LEFT JOIN strings s ON s.id = n.text_id
WHERE n.event_type = 39 AND n.gp IS NOT NULL;
CREATE TEMP TABLE nvtx_stats AS
SELECT count(*) AS open_ranges FROM nvtx WHERE event_type IN (59, 60, 70, 71) AND "end" IS NULL;

CREATE TEMP TABLE dom AS
SELECT n.gp, n.domain_id, min(coalesce(n.text, s.value)) AS domain
FROM nvtx n LEFT JOIN strings s ON s.id = n.text_id
WHERE n.event_type = 75 AND n.domain_id IS NOT NULL GROUP BY 1, 2;

CREATE TEMP TABLE nv0 AS
SELECT n.nvtx_id, coalesce(n.gp, -1) AS gp, coalesce(n.tid, -1) AS tid,
       n.start AS start_ns, n."end" AS end_ns, n.event_type,
       coalesce(n.text, s.value, '') AS name, coalesce(n.domain_id, 0) AS domain_id, d.domain,
       coalesce(n.json, js.value) AS json
FROM nvtx n
LEFT JOIN strings s ON s.id = n.text_id
LEFT JOIN strings js ON js.id = n.json_id
LEFT JOIN dom d ON d.gp = n.gp AND d.domain_id = n.domain_id
WHERE n.event_type IN (59, 60, 70, 71) AND n."end" >= n.start;
"""

# Once the raw NVTX table is released (``nv0`` holds what is left of it).
PREPARE_NV_SQL = rf"""
-- The step regexes run once per distinct range name, not once per range.
CREATE TEMP TABLE nv_names AS
SELECT name, regexp_matches(name, '{PROFILER_STEP_REGEX}') AS is_ps,
       regexp_matches(name, '{STEP_REGEX}') AS is_step,
       TRY_CAST(regexp_extract(name, '{STEP_REGEX}', 1) AS BIGINT) AS step_no
FROM (SELECT DISTINCT name FROM nv0);

CREATE TEMP TABLE nv AS
WITH unnamed AS (
  SELECT gp, domain_id, bool_and(starts_with(lower(name), 'nccl')) AS all_nccl
  FROM nv0 WHERE domain IS NULL AND domain_id <> 0 GROUP BY 1, 2),
ps AS (SELECT gp, bool_or(nn.is_ps) AS has_ps FROM nv0 JOIN nv_names nn USING (name) GROUP BY gp),
named AS (
  SELECT nv0.* REPLACE (CASE WHEN nv0.domain_id = 0 THEN NULL
           ELSE coalesce(nv0.domain, CASE WHEN u.all_nccl THEN 'NCCL' ELSE 'domain ' || nv0.domain_id END)
           END AS domain), ps.has_ps, nn.is_ps, nn.is_step, nn.step_no
  FROM nv0 LEFT JOIN unnamed u USING (gp, domain_id) LEFT JOIN ps USING (gp)
  JOIN nv_names nn USING (name))
SELECT * EXCLUDE (has_ps, is_ps, is_step, step_no),
  CASE WHEN domain IS DISTINCT FROM 'NCCL' AND (is_ps OR (NOT has_ps AND is_step))
       THEN step_no END AS step
FROM named;
DROP TABLE nv0;  -- nv holds all of it: freed before the joins that follow

CREATE TEMP VIEW launch_points AS
SELECT g.gid, g.gp, l.tid, l.launch_ns, g.device, g.stream, g.start_ns, g.end_ns
FROM g JOIN launch l USING (gid) WHERE g.kind IN ('kernel', 'graph', 'memcpy', 'memset');
"""

# Once every raw table is in.
PREPARE_END_SQL = """
CREATE TEMP TABLE stats AS
SELECT a.dropped, n.open_ranges, a.graphs FROM act_stats a, nvtx_stats n;
"""

# (raw table, the SQL that turns it into prepared tables, the SQL run once the raw
# table is released), in order: each step may use the prepared tables of the steps
# before it and the small raw tables.
PREPARE_STEPS = (
    ("runtime", PREPARE_API_SQL, ""),
    ("act", PREPARE_GPU_SQL, ""),
    ("osrt", PREPARE_OS_SQL, ""),
    ("nvtx", PREPARE_NVTX_SQL, PREPARE_NV_SQL),
)

# For the host rows of processes split by GPU: the GPU of each correlated call.
CORR_DEV_SQL = """
CREATE OR REPLACE TEMP TABLE corr_dev AS
SELECT gp, correlation, min(device) AS device FROM g
WHERE correlation IS NOT NULL AND gp IN (SELECT gp FROM units WHERE split)
GROUP BY 1, 2
"""

# After ``pairs(nvtx_id, gid)`` exists.
ENCLOSE_SQL = rf"""
CREATE TEMP TABLE proj AS
SELECT p.nvtx_id, l.device, l.stream, min(l.start_ns) AS start_ns, max(l.end_ns) AS end_ns
FROM pairs p JOIN launch_points l USING (gid) GROUP BY ALL;

CREATE TEMP TABLE nccl_of AS
SELECT p.gid, arg_max(n.name, n.start_ns) AS nccl_name, arg_max(n.nvtx_id, n.start_ns) AS nccl_id
FROM pairs p JOIN nv n USING (nvtx_id)
WHERE n.domain = 'NCCL' AND regexp_matches(n.name, '{NCCL_OP_REGEX}')
GROUP BY p.gid;

-- ``comm_name``: the name is a communication kernel's (the regex runs once per name).
CREATE TEMP TABLE names AS
SELECT CAST(row_number() OVER (ORDER BY name) - 1 AS INTEGER) AS name_id, name,
       regexp_matches(name, '{COMM_NAME_REGEX}') AS comm_name FROM (
  SELECT name FROM g UNION SELECT name FROM api UNION SELECT name FROM os UNION SELECT name FROM nv);

-- proj and nccl_of hold all the output needs of the range join: freed before the output.
DROP VIEW launch_points;
DROP TABLE pairs;
DROP TABLE launch;
DROP TABLE IF EXISTS rk;
"""

_UNIT_JOIN = (
    "JOIN units u ON u.gp = {t}.gp AND (NOT u.split OR {t}.{dev} IS NULL OR {t}.{dev} = u.device)"
)
_PID = "CASE WHEN {t}.gp < 0 THEN -1 ELSE {t}.gp & 16777215 END"
# A communication kernel: by its name, or launched inside an NCCL operation's range.
_COMM = "(g.kind = 'kernel' AND (nm.comm_name OR n.gid IS NOT NULL))"

GPU_OUT_SQL = f"""
SELECT u.tix, u.trace_id, g.device, g.stream,
  CASE WHEN g.kind = 'graph' THEN 'kernel' ELSE g.kind END AS kind,
  g.start_ns, g.end_ns, nm.name_id, g.correlation, CAST(NULL AS BIGINT) AS external_id,
  CAST(g.grid_x AS INTEGER) AS grid_x, CAST(g.grid_y AS INTEGER) AS grid_y, CAST(g.grid_z AS INTEGER) AS grid_z,
  CAST(g.block_x AS INTEGER) AS block_x, CAST(g.block_y AS INTEGER) AS block_y, CAST(g.block_z AS INTEGER) AS block_z,
  CAST(g.registers AS INTEGER) AS registers_per_thread,
  CASE WHEN g.smem_static IS NOT NULL OR g.smem_dynamic IS NOT NULL
       THEN coalesce(g.smem_static, 0) + coalesce(g.smem_dynamic, 0) END AS shared_mem_bytes,
  g.smem_static AS static_shared_mem_bytes, g.smem_dynamic AS dynamic_shared_mem_bytes, g.bytes,
  g.copy_kind, g.src_kind, g.dst_kind, g.sync_kind,
  CAST(NULL AS DOUBLE) AS est_occupancy_pct, CAST(NULL AS DOUBLE) AS blocks_per_sm,
  CAST(NULL AS DOUBLE) AS warps_per_sm,
  {_COMM} AS is_comm
FROM g {_UNIT_JOIN.format(t="g", dev="device")}
JOIN names nm ON nm.name = g.name
LEFT JOIN nccl_of n ON n.gid = g.gid
ORDER BY u.tix, g.device, g.start_ns, g.gid
"""

HOST_OUT_SQL = f"""
WITH h AS (
  SELECT a.gp, a.tid, a.kind, a.start_ns, a.end_ns, a.name, a.correlation, cd.device AS dev
  FROM api a LEFT JOIN corr_dev cd ON cd.gp = a.gp AND cd.correlation = a.correlation
  UNION ALL SELECT gp, tid, 'osrt', start_ns, end_ns, name, NULL, NULL FROM os
  UNION ALL SELECT gp, tid, 'annotation', start_ns, end_ns, name, NULL, NULL FROM nv)
SELECT u.tix, u.trace_id, {_PID.format(t="h")} AS pid, h.tid, h.kind, h.start_ns, h.end_ns,
  nm.name_id, h.correlation, CAST(NULL AS BIGINT) AS external_id
FROM h {_UNIT_JOIN.format(t="h", dev="dev")}
JOIN names nm ON nm.name = h.name
"""
HOST_ORDER = "u.tix, pid, h.tid, h.start_ns, h.end_ns DESC, h.kind, nm.name_id, h.correlation"

RANGES_OUT_SQL = f"""
WITH r AS (
  SELECT CASE WHEN step IS NOT NULL THEN 'step' ELSE 'nvtx' END AS kind, name, domain, gp, tid,
         CAST(NULL AS INTEGER) AS device, CAST(NULL AS BIGINT) AS stream, start_ns, end_ns, step,
         nvtx_id, 0 AS projected
  FROM nv
  UNION ALL
  SELECT 'gpu_annotation', n.name, n.domain, n.gp, NULL, p.device, p.stream, p.start_ns, p.end_ns,
         n.step, n.nvtx_id, 1
  FROM proj p JOIN nv n USING (nvtx_id))
SELECT u.tix, u.trace_id, r.kind, nm.name_id, r.domain,
  CASE WHEN r.kind = 'gpu_annotation' THEN NULL ELSE {_PID.format(t="r")} END AS pid,
  r.tid, r.device, r.stream, r.start_ns, r.end_ns, r.step, CAST(NULL AS BIGINT) AS external_id
FROM r {_UNIT_JOIN.format(t="r", dev="device")}
JOIN names nm ON nm.name = r.name
"""
# ``projected``: a range's own row first, then its GPU projections (``kind DESC``, by integer)
RANGES_ORDER = "u.tix, r.start_ns, r.nvtx_id, r.projected, r.device, r.stream"

COLLECTIVES_OUT_SQL = f"""
SELECT u.tix, u.trace_id, u.rank, g.device, g.stream,
  pl.comm AS pg_name, CAST(NULL AS VARCHAR) AS pg_desc, CAST(NULL AS VARCHAR) AS pg_ranks,
  CAST(pl.nranks AS INTEGER) AS group_size, CAST(NULL AS BIGINT) AS seq,
  CAST(row_number() OVER (PARTITION BY u.tix, coalesce(pl.comm, ''), g.device
                          ORDER BY g.start_ns, g.gid) - 1 AS BIGINT) AS order_in_group,
  CASE WHEN stallscope_coll_op(NULL, g.name) <> 'unknown' THEN stallscope_coll_op(NULL, g.name)
       WHEN n.nccl_name IS NOT NULL AND NOT regexp_matches(n.nccl_name, 'GroupEnd')
       THEN stallscope_norm_op(lower(regexp_replace(n.nccl_name, '^nccl', '')))
       ELSE 'unknown' END AS op,
  CAST(NULL AS BIGINT) AS in_nelems, CAST(NULL AS BIGINT) AS out_nelems, CAST(NULL AS VARCHAR) AS dtype,
  pl.msg_bytes AS in_bytes, CAST(NULL AS BIGINT) AS out_bytes,
  g.start_ns, g.end_ns, nm.name_id, g.correlation, CAST(NULL AS BIGINT) AS external_id,
  n.gid IS NOT NULL AS from_metadata
FROM g {_UNIT_JOIN.format(t="g", dev="device")}
JOIN names nm ON nm.name = g.name
LEFT JOIN nccl_of n ON n.gid = g.gid
LEFT JOIN nccl_payload pl ON pl.nvtx_id = n.nccl_id
WHERE {_COMM}
ORDER BY u.tix, g.start_ns, g.gid
"""

THREADS_OUT_SQL = f"""
WITH t AS (
  SELECT p.gp, CAST(NULL AS BIGINT) AS tid, 'process' AS kind, p.name FROM processes p
  WHERE p.name IS NOT NULL
  UNION ALL
  SELECT * FROM (
    SELECT t.gp, t.tid, 'thread' AS kind, s.value AS name
    FROM thread_names t JOIN strings s ON s.id = t.name_id
    QUALIFY row_number() OVER (PARTITION BY t.gp, t.tid ORDER BY t.priority DESC NULLS LAST, s.value) = 1))
SELECT DISTINCT u.tix, u.trace_id, {_PID.format(t="t")} AS pid, t.tid, t.kind, t.name
FROM t JOIN units u ON u.gp = t.gp
ORDER BY u.tix, kind, pid, tid NULLS FIRST
"""
