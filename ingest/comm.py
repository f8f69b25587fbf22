"""Communication-kernel recognition shared by every ingest format.

Metadata first (Kineto ``Collective name`` args, the NCCL NVTX domain in
nsys); these name patterns are the fallback. They match NCCL/RCCL kernels
(``ncclKernel_*``, ``ncclDevKernel_*``, ``rccl*``), PyTorch symmetric-memory
collectives and vLLM/TensorRT-LLM custom all-reduce kernels, and never a
plain ``hip*`` compute kernel.
"""

COMM_NAME_REGEX = (
    r"(?i)(^|[^a-z])(nccl|rccl)[a-z]*kernel|^(nccl|rccl)"
    r"|multimem_all_(reduce|gather)|one_shot_all_reduce|two_shot_all_reduce"
    r"|cross_device_reduce|custom_all_reduce|allreduce_fusion_kernel"
)

# DuckDB macros: normalised collective op and element size of a dtype name.
MACROS_SQL = r"""
CREATE OR REPLACE TEMP MACRO stallscope_norm_op(x) AS
  CASE WHEN x LIKE '%allreduce%' THEN 'allreduce'
       WHEN x LIKE '%allgather%' THEN 'allgather'
       WHEN x LIKE '%reducescatter%' THEN 'reducescatter'
       WHEN x LIKE '%alltoall%' THEN 'alltoall'
       WHEN x LIKE '%broadcast%' THEN 'broadcast'
       WHEN x LIKE '%sendrecv%' THEN 'sendrecv'
       WHEN x LIKE '%send%' THEN 'send'
       WHEN x LIKE '%recv%' THEN 'recv'
       WHEN x LIKE '%barrier%' THEN 'barrier'
       WHEN x LIKE '%reduce%' THEN 'reduce'
       ELSE x END;
CREATE OR REPLACE TEMP MACRO stallscope_coll_op(collective, kname) AS
  stallscope_norm_op(lower(regexp_replace(coalesce(
      collective,
      nullif(regexp_extract(kname, '(?i)(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)', 1), ''),
      nullif(regexp_extract(kname, '(?i)(all_?reduce|all_?gather|reduce_?scatter)', 1), ''),
      'unknown'), '[^A-Za-z]', '', 'g')));
CREATE OR REPLACE TEMP MACRO stallscope_dtype_bytes(d) AS
  CASE WHEN d IS NULL THEN NULL
       WHEN lower(d) IN ('double', 'float64', 'long', 'int64', 'uint64', 'complexfloat') THEN 8
       WHEN lower(d) IN ('float', 'float32', 'int', 'int32', 'uint32') THEN 4
       WHEN lower(d) IN ('bfloat16', 'half', 'float16', 'short', 'int16') THEN 2
       WHEN lower(d) IN ('byte', 'char', 'bool', 'int8', 'uint8')
            OR lower(d) LIKE 'float8%' THEN 1
       ELSE NULL END;
"""
